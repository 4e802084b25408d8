//! The faults: a planned failover, kill -9 of the primary's postmaster or of
//! one Stockguard process.

use super::*;

/// Injects `fault`; when it took effect: when a planned failover was asked
/// for (it returns once done), or when the signal was sent.
pub(super) async fn inject(formation: &Formation, fault: Fault) -> anyhow::Result<Instant> {
    let at = match fault {
        Fault::Planned => {
            let dir = formation.dir.clone();
            let base = formation.ports.base;
            let asked = Instant::now();
            tokio::task::spawn_blocking(move || Formation::new(&dir, base)?.perform_failover()).await??;
            eprintln!("failover: pg_autoctl perform failover returned after {:.1?}", asked.elapsed());
            asked
        }
        Fault::KillPrimary => {
            let primary = formation.primary()?.context("no primary to kill")?;
            let pid = formation.postmaster_pid(&primary.name)?;
            eprintln!("failover: kill -9 {pid} (the postmaster of {}, the primary)", primary.name);
            kill9(pid)?
        }
        Fault::KillApp => {
            let pid = formation.app_pid(VICTIM_APP).context("no pid of the victim app")?;
            eprintln!("failover: kill -9 {pid} (Stockguard {VICTIM_APP})");
            kill9(pid)?
        }
    };
    Ok(at)
}

/// `kill -9 pid`; the moment it returned (the signal was delivered by then).
pub(super) fn kill9(pid: u32) -> anyhow::Result<Instant> {
    let status = std::process::Command::new("kill").arg("-KILL").arg(pid.to_string()).status()?;
    if !status.success() {
        bail!("kill -9 {pid} failed");
    }
    Ok(Instant::now())
}
