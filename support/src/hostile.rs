//! Hostile GraphQL documents, shared by the attack tests and the property
//! tests: values nested deep, fragments that fan out, alias floods.

/// `levels` brackets of `[` around `1`, and as many `]`.
pub fn nested_list(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

/// A deep list value in one of three places (0: a field argument, 1: a
/// variable's default, 2: a directive argument).
pub fn deep_value(levels: usize, place: usize) -> String {
    let deep = nested_list(levels);
    match place % 3 {
        0 => format!("{{ inventories(after: {deep}) {{ pageInfo {{ hasNextPage }} }} }}"),
        1 => format!("query($x: [Int] = {deep}) {{ __typename }}"),
        _ => format!("{{ __typename @skip(if: {deep}) }}"),
    }
}

/// `levels` fragments, each spreading the next one twice: 2^levels leaves.
pub fn fragment_fan_out(levels: usize) -> String {
    let mut query = String::from("query { ...F0 }");
    for i in 0..levels {
        query.push_str(&format!(" fragment F{i} on Query {{ ...F{n} ...F{n} }}", n = i + 1));
    }
    query.push_str(&format!(" fragment F{levels} on Query {{ __typename }}"));
    query
}

/// `count` aliases of `field` in one operation, each `a<i>: field`.
pub fn aliases(operation: &str, field: &str, count: usize) -> String {
    let fields: Vec<String> = (0..count).map(|i| format!("a{i}:{field}")).collect();
    format!("{operation} {{ {} }}", fields.join(" "))
}
