#!/usr/bin/env bash
# The reserve statement alone, on variants of the schema: each variant is a
# copy of the migrated schema with one change, measured with pgbench on
# RESERVE_SQL exactly as the benchmark's limit runs it (prepared, one
# connection per client, one unit of a random one of 10,000 inventories).
# Variants take turns round by round, so whatever else the machine does falls
# on all alike; the median tps per variant is reported with its ratio to the
# schema of this commit ("current").
#
#   bench/statement/run.sh                    # 16 clients, 3 rounds of 10 s
#   CLIENTS=64 ROUNDS=5 SECS=10 bench/statement/run.sh
#   VARIANTS="current previous" bench/statement/run.sh
#
# Needs target/release/stockguard and target/release/examples/bench (cargo
# build --release --bin stockguard --example bench) and a PostgreSQL at
# PGURL (default postgres://postgres@127.0.0.1:5432); the databases it makes
# (sg_stmt_*) are dropped at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
CLIENTS=${CLIENTS:-16}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-10}
PGBENCH=${PGBENCH:-$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)}
VARIANTS=${VARIANTS:-"current previous with_reservations_inventory without_brin no_watch_trigger reservation_id_v7 ledger_id_bigint"}
BIN=target/release
TAG=$$
WORK=$(mktemp -d)
trap 'for v in base $VARIANTS; do psql -q "$PGURL/postgres" -c "DROP DATABASE IF EXISTS sg_stmt_${TAG}_$v WITH (FORCE)" >/dev/null 2>&1 || true; done; rm -rf "$WORK"' EXIT

# A v7 UUID (RFC 9562) in SQL, for the variant whose reservation ids are
# time-ordered: the server makes them with the uuid crate; here the id is
# made in the statement, as gen_random_uuid() is for the others.
UUID_V7='CREATE FUNCTION uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
  SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING
         substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
         52, 1), 53, 1), '"'"'hex'"'"')::uuid $$;'

# What each variant changes on the migrated schema.
variant_sql() {
  case $1 in
    current) echo "SELECT 1" ;;
    # The schema before bench/results/decisions.md's changes.
    previous) cat <<'SQL'
CREATE INDEX reservations_inventory ON reservations (inventory_id);
DROP INDEX reservations_created_brin;
DROP INDEX stock_movements_created_brin;
SQL
    ;;
    # An index no query reads: reservations by inventory (the held rows
    # have their own partial index, reservations_held).
    with_reservations_inventory) echo "CREATE INDEX reservations_inventory ON reservations (inventory_id)" ;;
    # What the retention's time indexes cost each reservation.
    without_brin) echo "DROP INDEX reservations_created_brin; DROP INDEX stock_movements_created_brin" ;;
    # Ledger rows keyed by a sequence instead of a random uuid.
    ledger_id_bigint) echo "ALTER TABLE stock_movements DROP COLUMN id, ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY" ;;
    # Upper bound of what announcing live stock can cost: no trigger at all.
    no_watch_trigger) echo "DROP TRIGGER inventories_notify ON inventories" ;;
    reservation_id_v7) echo "$UUID_V7" ;;
    # Events out (docs/design.md): the schema before it, without the
    # transaction each ledger row records (and its BRIN index); "current"
    # is the ledger as the outbox.
    no_txid) echo "ALTER TABLE stock_movements DROP COLUMN txid" ;;
    # The alternative: an outbox row (with its keys) per change besides the
    # ledger row, written in the change's statement; here by a trigger, so
    # an upper bound.
    outbox_row) cat <<'SQL'
CREATE TABLE outbox_rows (seq bigserial PRIMARY KEY, id uuid NOT NULL,
    txid bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint), body jsonb NOT NULL);
CREATE INDEX outbox_rows_txid ON outbox_rows (txid);
CREATE FUNCTION outbox_row() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO outbox_rows (id, body) VALUES (NEW.id, jsonb_build_object('inventoryId', NEW.inventory_id,
        'version', NEW.version_after, 'delta', NEW.delta, 'reason', NEW.reason, 'available', NEW.stock_after));
    RETURN NULL;
END $f$;
CREATE TRIGGER stock_movements_outbox AFTER INSERT ON stock_movements FOR EACH ROW EXECUTE FUNCTION outbox_row();
SQL
    ;;
    # The sole-location reserve without its look-up of the level's safety
    # stock (issue 47): the schema as it is, the statement edited below.
    no_safety_lookup) echo "SELECT 1" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

psql -q "$PGURL/postgres" -c "CREATE DATABASE sg_stmt_${TAG}_base" >/dev/null
DATABASE_URL="$PGURL/sg_stmt_${TAG}_base" STOCKGUARD_LOG_FORMAT=text RUST_LOG=warn "$BIN/stockguard" migrate >/dev/null
psql -q "$PGURL/sg_stmt_${TAG}_base" >/dev/null <<'SQL'
INSERT INTO inventories (id, sku, name, stock)
SELECT lpad(to_hex(n), 32, '0')::uuid, 'S-' || n, 'spread ' || n, 1000000000 FROM generate_series(1, 10000) n;
SQL
for v in $VARIANTS; do
  psql -q "$PGURL/postgres" -c "CREATE DATABASE sg_stmt_${TAG}_$v TEMPLATE sg_stmt_${TAG}_base" >/dev/null
  variant_sql "$v" | psql -q -v ON_ERROR_STOP=1 "$PGURL/sg_stmt_${TAG}_$v" >/dev/null
  id='gen_random_uuid()'
  if [ "$v" = reservation_id_v7 ]; then id='uuid_v7()'; fi
  "$BIN/examples/bench" statement-script --id-function "$id" >"$WORK/$v.sql"
  if [ "$v" = no_safety_lookup ]; then
    sed -i 's/(SELECT safety_stock FROM stock_levels WHERE inventory_id = inventories.id AND location_id = inventories.sole_location_id)/0/' "$WORK/$v.sql"
    if grep -q 'SELECT safety_stock' "$WORK/$v.sql"; then echo "no_safety_lookup: the look-up was not found" >&2; exit 2; fi
  fi
done

# What one reservation writes, which the machine's load does not move: WAL
# bytes and buffers dirtied per statement (EXPLAIN ANALYZE, WAL, BUFFERS of
# 500 runs of the statement, one session, summed over the plan's top node),
# after 1,000 runs that take the full-page images of the touched pages.
wal_per_reservation() {
  local file=$1 db=$2 sql
  sql=$(sed -e '1d' -e 's/;$//' -e "s/:n::integer/(1 + floor(random() * 10000))::integer/" \
             -e "s/:client_id::text/'wal'/" "$file")
  psql -qAt "$db" <<SQL
CREATE FUNCTION pg_temp.wal_of(runs integer) RETURNS text LANGUAGE plpgsql AS \$f\$
DECLARE plan json; wal numeric := 0; dirtied numeric := 0;
BEGIN
  FOR i IN 1..runs LOOP
    EXECUTE 'EXPLAIN (ANALYZE, WAL, BUFFERS, FORMAT JSON) ' || \$q\$ $sql \$q\$ INTO plan;
    wal := wal + (plan->0->'Plan'->>'WAL Bytes')::numeric;
    dirtied := dirtied + (plan->0->'Plan'->>'Shared Dirtied Blocks')::numeric;
  END LOOP;
  RETURN round(wal / runs) || ' ' || round(dirtied / runs, 2);
END \$f\$;
SELECT pg_temp.wal_of(1000) \\g /dev/null
SELECT pg_temp.wal_of(500);
SQL
}
for v in $VARIANTS; do
  echo "$v $(wal_per_reservation "$WORK/$v.sql" "$PGURL/sg_stmt_${TAG}_$v")" >>"$WORK/wal"
done

for round in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    db="$PGURL/sg_stmt_${TAG}_$v"
    psql -q "$db" -c "VACUUM ANALYZE inventories" -c "CHECKPOINT" >/dev/null
    out=$("$PGBENCH" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$WORK/$v.sql" "$db" 2>&1)
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
    lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$out")
    echo "round $round $v: $tps tps, latency average $lat ms" >&2
    echo "$v $tps $lat" >>"$WORK/results"
  done
done

echo "| variant | median tps | ratio to current | median latency ms | runs (tps) | WAL bytes / reservation | buffers dirtied / reservation |"
echo "|---|--:|--:|--:|---|--:|--:|"
base=$(awk '$1=="current"{print $2}' "$WORK/results" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
for v in $VARIANTS; do
  med=$(awk -v v="$v" '$1==v{print $2}' "$WORK/results" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
  lat=$(awk -v v="$v" '$1==v{print $3}' "$WORK/results" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
  runs=$(awk -v v="$v" '$1==v{printf "%s%.0f", sep, $2; sep=", "}' "$WORK/results")
  ratio=$(awk -v a="$med" -v b="${base:-0}" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "-" }')
  read -r _ wal dirtied < <(grep "^$v " "$WORK/wal")
  echo "| $v | ${med%.*} | $ratio | $lat | $runs | $wal | $dirtied |"
done
