//! The schema's shapes, read once from its SDL, for two parts of the spec
//! async-graphql 7.2 leaves out:
//!
//! - **Field errors**: an errored field is `null`, and a `null` in a
//!   non-null position moves up to the nearest nullable parent (or makes
//!   `data` itself `null`). async-graphql leaves an errored field out of its
//!   parent's object instead, so clients that cache by shape (Apollo, Relay)
//!   read a partial object as complete. [`Shapes::propagate`] restores the
//!   spec's result after execution, from each error's path, the document's
//!   selections (a response key's field and type) and the field types. It
//!   only runs for a response that has field errors.
//! - **Variable coercion**: a variable whose value is not of its type, or a
//!   non-null one that is not given, is a request error, before anything
//!   runs. async-graphql checks the built-in scalars at validation, but not
//!   `UUID` and `DateTime` (whose bad values only fail the field that reads
//!   them) nor missing variables (which fail at execution), and it reads a
//!   paginated field's `first` for its complexity before its own checks, so
//!   a bad one there reaches the client as an error of the document.
//!   [`Shapes::coerce`] checks the scalars, nulls and presence, through lists
//!   and input objects, so every such refusal is ours, with its code.

use std::collections::HashMap;

use async_graphql::{
    Name, PathSegment, Positioned, Response, ServerError, Value, Variables,
    parser::types::{
        BaseType, ExecutableDocument, Field, FieldDefinition, Selection, SelectionSet, Type, TypeKind,
        TypeSystemDefinition, VariableDefinition,
    },
};

use crate::error::ErrorCode;

/// The declared type of every field of every object, interface and input type.
pub(super) struct Shapes {
    /// Output fields, by type and field name.
    fields: HashMap<String, HashMap<String, Type>>,
    /// Input object fields, by type and field name.
    inputs: HashMap<String, HashMap<String, Type>>,
}

impl Shapes {
    /// The shapes of the schema printed as `sdl`.
    pub(super) fn from_sdl(sdl: &str) -> Self {
        let mut shapes = Self { fields: HashMap::new(), inputs: HashMap::new() };
        let Ok(document) = async_graphql::parser::parse_schema(sdl) else {
            tracing::error!("the schema's own SDL does not parse; field errors keep async-graphql's shape");
            return shapes;
        };
        for definition in document.definitions {
            let TypeSystemDefinition::Type(definition) = definition else { continue };
            let name = definition.node.name.node.to_string();
            let (map, declared): (_, Vec<(Name, Type)>) = match definition.node.kind {
                TypeKind::Object(object) => (&mut shapes.fields, fields_of(object.fields)),
                TypeKind::Interface(interface) => (&mut shapes.fields, fields_of(interface.fields)),
                TypeKind::InputObject(input) => {
                    (&mut shapes.inputs, input.fields.into_iter().map(|f| (f.node.name.node, f.node.ty.node)).collect())
                }
                _ => continue,
            };
            map.entry(name).or_default().extend(declared.into_iter().map(|(field, ty)| (field.to_string(), ty)));
        }
        shapes
    }

    /// Refuses variables whose values are not of their declared types, where
    /// async-graphql does not (see the module docs).
    pub(super) fn coerce(
        &self,
        definitions: &[Positioned<VariableDefinition>],
        variables: &Variables,
    ) -> Result<(), ServerError> {
        for definition in definitions {
            let (name, ty) = (&definition.node.name.node, &definition.node.var_type.node);
            let refused = match variables.get(name) {
                Some(value) => {
                    self.check(ty, value).err().map(|why| format!("variable ${name} is not of type {ty}: {why}"))
                }
                None if definition.node.default_value.is_none() && !ty.nullable => {
                    Some(format!("variable ${name} of type {ty} is not given"))
                }
                None => None,
            };
            if let Some(message) = refused {
                return Err(super::coded(ServerError::new(message, Some(definition.pos)), ErrorCode::BadUserInput));
            }
        }
        Ok(())
    }

    /// Whether `value` fits `ty`: its nulls, its scalars and its input
    /// objects' fields (a missing field of an input object is left to
    /// async-graphql's validation).
    fn check(&self, ty: &Type, value: &Value) -> Result<(), String> {
        match (&ty.base, value) {
            (_, Value::Null) if ty.nullable => Ok(()),
            (_, Value::Null) => Err(format!("null where {ty} is needed")),
            (BaseType::List(item), Value::List(items)) => items.iter().try_for_each(|value| self.check(item, value)),
            // A single value stands for a list of one (input coercion).
            (BaseType::List(item), value) => self.check(item, value),
            (BaseType::Named(name), value) => match (name.as_str(), value) {
                ("UUID", Value::String(text)) => {
                    uuid::Uuid::parse_str(text).map(drop).map_err(|_| format!("{text:?} is not a UUID"))
                }
                ("DateTime", Value::String(text)) => chrono::DateTime::parse_from_rfc3339(text)
                    .map(drop)
                    .map_err(|_| format!("{text:?} is not an RFC 3339 date-time")),
                ("String", Value::String(_)) | ("Boolean", Value::Boolean(_)) => Ok(()),
                ("UUID" | "DateTime" | "String", value) => Err(format!("{value} is not a string")),
                ("Boolean", value) => Err(format!("{value} is not a boolean")),
                ("Int", Value::Number(number)) if number.as_i64().is_some_and(|n| i32::try_from(n).is_ok()) => Ok(()),
                ("Int", value) => Err(format!("{value} is not a 32-bit integer")),
                ("Float", Value::Number(_)) => Ok(()),
                ("Float", value) => Err(format!("{value} is not a number")),
                ("ID", Value::String(_)) => Ok(()),
                ("ID", Value::Number(number)) if number.is_i64() || number.is_u64() => Ok(()),
                ("ID", value) => Err(format!("{value} is not an ID")),
                (input, Value::Object(object)) => {
                    let Some(fields) = self.inputs.get(input) else { return Ok(()) };
                    object.iter().try_for_each(|(field, value)| match fields.get(field.as_str()) {
                        Some(ty) => self.check(ty, value).map_err(|why| format!("{field}: {why}")),
                        None => Ok(()),
                    })
                }
                _ => Ok(()),
            },
        }
    }

    fn field(&self, parent: &str, name: &str) -> Option<&Type> {
        self.fields.get(parent)?.get(name)
    }

    /// Puts the spec's nulls into `response` for every field error in it.
    /// `root` is the operation's root type, `selections` its selection set.
    pub(super) fn propagate(
        &self,
        response: &mut Response,
        document: &ExecutableDocument,
        root: &str,
        selections: &SelectionSet,
    ) {
        let paths: Vec<Vec<PathSegment>> =
            response.errors.iter().filter(|e| !e.path.is_empty()).map(|e| e.path.clone()).collect();
        for path in paths {
            let Some(nullable) = self.nullability(document, root, selections, &path) else { continue };
            null_out(&mut response.data, &path, &nullable);
        }
    }

    /// Whether each position on `path` may hold `null`, from the schema.
    fn nullability(
        &self,
        document: &ExecutableDocument,
        root: &str,
        selections: &SelectionSet,
        path: &[PathSegment],
    ) -> Option<Vec<bool>> {
        let mut nullable = Vec::with_capacity(path.len());
        let mut parent = root.to_owned();
        let mut sets: Vec<&SelectionSet> = vec![selections];
        let mut current: Option<Type> = None;
        for segment in path {
            match segment {
                PathSegment::Field(key) => {
                    let found = sets.iter().flat_map(|set| by_key(document, set, key, None)).collect::<Vec<_>>();
                    let (field, on) = found.first()?;
                    let owner = on.as_deref().unwrap_or(parent.as_str());
                    let ty = self.field(owner, &field.name.node).or_else(|| self.field(&parent, &field.name.node))?;
                    nullable.push(ty.nullable);
                    sets = found.iter().map(|(field, _)| &field.selection_set.node).collect();
                    parent = named(ty).to_owned();
                    current = Some(ty.clone());
                }
                PathSegment::Index(_) => {
                    let BaseType::List(item) = current?.base else { return None };
                    nullable.push(item.nullable);
                    current = Some(*item);
                }
            }
        }
        Some(nullable)
    }
}

fn fields_of(fields: Vec<Positioned<FieldDefinition>>) -> Vec<(Name, Type)> {
    fields.into_iter().map(|f| (f.node.name.node, f.node.ty.node)).collect()
}

/// The named type under any list wrappers.
fn named(ty: &Type) -> &str {
    match &ty.base {
        BaseType::Named(name) => name.as_str(),
        BaseType::List(item) => named(item),
    }
}

/// Every field selected under response key `key` in `set`, through inline
/// fragments and fragment spreads, with the type condition it sits under.
fn by_key<'a>(
    document: &'a ExecutableDocument,
    set: &'a SelectionSet,
    key: &str,
    on: Option<String>,
) -> Vec<(&'a Field, Option<String>)> {
    let mut found = Vec::new();
    for selection in &set.items {
        match &selection.node {
            Selection::Field(field) if field.node.response_key().node.as_str() == key => {
                found.push((&field.node, on.clone()));
            }
            Selection::Field(_) => {}
            Selection::InlineFragment(inline) => {
                let on = inline.node.type_condition.as_ref().map(|c| c.node.on.node.to_string()).or_else(|| on.clone());
                found.extend(by_key(document, &inline.node.selection_set.node, key, on));
            }
            Selection::FragmentSpread(spread) => {
                if let Some(fragment) = document.fragments.get(&spread.node.fragment_name.node) {
                    let on = Some(fragment.node.type_condition.node.on.node.to_string());
                    found.extend(by_key(document, &fragment.node.selection_set.node, key, on));
                }
            }
        }
    }
    found
}

/// Sets the value at `path` to null, then moves the null up while the
/// position it is in may not hold one.
fn null_out(data: &mut Value, path: &[PathSegment], nullable: &[bool]) {
    let mut depth = path.len();
    // The errored field is null (async-graphql left it out).
    if !set_null(data, &path[..depth]) {
        return;
    }
    while depth > 0 && !nullable[depth - 1] {
        depth -= 1;
        if depth == 0 {
            *data = Value::Null;
            return;
        }
        if !set_null(data, &path[..depth]) {
            return;
        }
    }
}

/// Sets the value at `path` to null; false when its parent is not there
/// (an ancestor is already null).
fn set_null(data: &mut Value, path: &[PathSegment]) -> bool {
    let Some((last, parents)) = path.split_last() else { return false };
    let mut value = data;
    for segment in parents {
        value = match (segment, value) {
            (PathSegment::Field(key), Value::Object(object)) => match object.get_mut(key.as_str()) {
                Some(next) => next,
                None => return false,
            },
            (PathSegment::Index(i), Value::List(items)) => match items.get_mut(*i) {
                Some(next) => next,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, value) {
        (PathSegment::Field(key), Value::Object(object)) => {
            object.insert(Name::new(key), Value::Null);
            true
        }
        (PathSegment::Index(i), Value::List(items)) if *i < items.len() => {
            items[*i] = Value::Null;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use async_graphql::{ServerError, parser::types::DocumentOperations};
    use serde_json::json;

    use super::*;

    const SDL: &str = r#"
type Query { inventory(id: ID!): Inventory  inventories: InventoryConnection!  me: Me! }
type Me { name: String! }
type InventoryConnection { nodes: [Inventory!]! }
type Inventory { sku: String!  movements: MovementConnection!  note: String }
type MovementConnection { total: Int! }
"#;

    /// Runs the propagation over `data` with errors at `paths`.
    fn after(query: &str, data: serde_json::Value, paths: &[Vec<PathSegment>]) -> serde_json::Value {
        let document = async_graphql::parser::parse_query(query).expect("query");
        let DocumentOperations::Single(operation) = &document.operations else { panic!("one operation") };
        let mut response = Response::new(Value::from_json(data).expect("data"));
        response.errors = paths.iter().map(|path| ServerError::new("boom", None).with_path(path.clone())).collect();
        Shapes::from_sdl(SDL).propagate(&mut response, &document, "Query", &operation.node.selection_set.node);
        response.data.into_json().expect("json")
    }

    fn field(name: &str) -> PathSegment {
        PathSegment::Field(name.to_owned())
    }

    fn coerce(variables: serde_json::Value) -> Result<(), ServerError> {
        let sdl =
            format!("{SDL} input Line {{ id: UUID!  at: DateTime  tags: [String!] }} scalar UUID scalar DateTime");
        let document =
            async_graphql::parser::parse_query("query($lines: [Line!]!, $one: UUID) { __typename }").expect("query");
        let DocumentOperations::Single(operation) = &document.operations else { panic!("one operation") };
        let variables = Variables::from_json(variables);
        Shapes::from_sdl(&sdl).coerce(&operation.node.variable_definitions, &variables)
    }

    #[test]
    fn variables_of_unchecked_scalars_are_coerced_through_lists_and_input_objects() {
        let id = "00000000-0000-0000-0000-000000000001";
        assert!(coerce(json!({ "lines": [{ "id": id, "at": "2026-12-01T10:00:00Z" }], "one": id })).is_ok());
        assert!(coerce(json!({ "lines": { "id": id } })).is_ok(), "one value for a list of one");
        assert!(coerce(json!({ "lines": [{ "id": "nope" }] })).is_err());
        assert!(coerce(json!({ "lines": [{ "id": id, "at": "yesterday" }] })).is_err());
        assert!(coerce(json!({ "lines": [], "one": 42 })).is_err());
        let error = coerce(json!({ "lines": [], "one": "x" })).expect_err("refused");
        assert_eq!(super::super::code_of(&error), Some(ErrorCode::BadUserInput));
    }

    #[test]
    fn built_in_scalars_nulls_and_missing_variables_are_refused_before_validation() {
        let refused = |declared: &str, variables: serde_json::Value| {
            let query = format!("query({declared}) {{ __typename }}");
            let document = async_graphql::parser::parse_query(query).expect("query");
            let DocumentOperations::Single(operation) = &document.operations else { panic!("one operation") };
            Shapes::from_sdl(SDL)
                .coerce(&operation.node.variable_definitions, &Variables::from_json(variables))
                .is_err()
        };
        assert!(refused("$f: Int", json!({ "f": "ten" })));
        assert!(refused("$f: Int", json!({ "f": 3_000_000_000_i64 })));
        assert!(refused("$f: Int", json!({ "f": 1.5 })));
        assert!(!refused("$f: Int", json!({ "f": 10 })));
        assert!(!refused("$f: Int", json!({})), "a nullable variable may be left out");
        assert!(refused("$f: Int!", json!({})), "a non-null one may not");
        assert!(!refused("$f: Int! = 3", json!({})), "unless it has a default");
        assert!(refused("$f: Int!", json!({ "f": null })));
        assert!(refused("$s: [String!]", json!({ "s": ["a", null] })));
        assert!(refused("$b: Boolean", json!({ "b": "yes" })));
        assert!(!refused("$i: ID, $x: Float", json!({ "i": 7, "x": 1 })));
    }

    #[test]
    fn an_errored_nullable_field_is_null_and_its_parent_stays() {
        let data = after(
            "{ inventory(id: 1) { sku note } }",
            json!({ "inventory": { "sku": "A" } }),
            &[vec![field("inventory"), field("note")]],
        );
        assert_eq!(data, json!({ "inventory": { "sku": "A", "note": null } }));
    }

    #[test]
    fn a_non_null_field_error_nulls_the_nearest_nullable_parent() {
        let data = after(
            "{ inventory(id: 1) { sku movements { total } } }",
            json!({ "inventory": { "sku": "A" } }),
            &[vec![field("inventory"), field("movements")]],
        );
        assert_eq!(data, json!({ "inventory": null }));
    }

    #[test]
    fn through_non_null_lists_and_aliases_up_to_data() {
        let query = "{ all: inventories { nodes { sku ...M } } } fragment M on Inventory { m: movements { total } }";
        let data = after(
            query,
            json!({ "all": { "nodes": [{ "sku": "A" }, { "sku": "B" }] } }),
            &[vec![field("all"), field("nodes"), PathSegment::Index(1), field("m")]],
        );
        assert_eq!(data, json!(null));
    }

    #[test]
    fn a_root_field_error_beside_a_nullable_one_nulls_data() {
        let data =
            after("{ a: inventory(id: 1) { sku } me { name } }", json!({ "a": { "sku": "A" } }), &[vec![field("me")]]);
        assert_eq!(data, json!(null));
        let data = after(
            "{ a: inventory(id: 1) { sku } b: inventory(id: 2) { sku } }",
            json!({ "a": { "sku": "A" } }),
            &[vec![field("b")]],
        );
        assert_eq!(data, json!({ "a": { "sku": "A" }, "b": null }));
    }
}
