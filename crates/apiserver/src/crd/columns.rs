//! A CRD's `additionalPrinterColumns`: the Table columns `kubectl get` shows, each a JSONPath
//! into the object.
//!
//! The JSONPath subset is the one CRDs use: `.a.b`, indexes `[0]`, filters
//! `[?(@.type=="Ready")]` (either quote), and `[*]`. A path that finds nothing gives an empty
//! cell, several values are joined with commas, as kube-apiserver's printer does.

use serde_json::{json, Value};

/// One printer column.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub ty: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    path: Vec<Step>,
}

/// One step of a parsed JSONPath.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Field(String),
    Index(usize),
    All,
    Filter(String, Value),
}

/// Parses a column's JSONPath; `None` when it is not of the supported subset.
#[must_use]
pub fn parse(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    let mut rest = path.trim();
    if rest.starts_with('{') && rest.ends_with('}') {
        rest = &rest[1..rest.len() - 1];
    }
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return None;
            }
            steps.push(Step::Field(r[..end].to_owned()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = r[..end].trim();
            rest = &r[end + 1..];
            if inner == "*" {
                steps.push(Step::All);
            } else if let Ok(i) = inner.parse::<usize>() {
                steps.push(Step::Index(i));
            } else {
                let cond = inner.strip_prefix("?(@.")?.strip_suffix(')')?;
                let (field, value) = cond.split_once("==")?;
                let value = value.trim();
                let literal = value
                    .strip_prefix('\'')
                    .and_then(|v| v.strip_suffix('\''))
                    .or_else(|| value.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
                    .map(|s| json!(s))
                    .or_else(|| serde_json::from_str(value).ok())?;
                steps.push(Step::Filter(field.trim().to_owned(), literal));
            }
        } else {
            return None;
        }
    }
    Some(steps)
}

/// The columns of a CRD version's `additionalPrinterColumns`; a column whose path does not
/// parse is left out (CRD validation refuses such CRDs; this covers ones stored before).
#[must_use]
pub fn from_crd(list: Option<&Value>) -> Vec<Column> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
            Some(Column {
                name: text("name"),
                ty: text("type"),
                format: text("format"),
                description: text("description"),
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                path: parse(c.get("jsonPath").and_then(Value::as_str)?)?,
            })
        })
        .collect()
}

fn eval<'a>(steps: &[Step], v: &'a Value, out: &mut Vec<&'a Value>) {
    let Some((step, rest)) = steps.split_first() else {
        out.push(v);
        return;
    };
    match step {
        Step::Field(f) => {
            if let Some(x) = v.get(f) {
                eval(rest, x, out);
            }
        }
        Step::Index(i) => {
            if let Some(x) = v.get(*i) {
                eval(rest, x, out);
            }
        }
        Step::All => {
            for x in v.as_array().into_iter().flatten() {
                eval(rest, x, out);
            }
        }
        Step::Filter(f, want) => {
            for x in v.as_array().into_iter().flatten().filter(|x| x.get(f) == Some(want)) {
                eval(rest, x, out);
            }
        }
    }
}

impl Column {
    /// The cell of this column for `obj`; `now` (Unix seconds) for `date` columns.
    #[must_use]
    pub fn cell(&self, obj: &Value, now: i64) -> Value {
        let mut found = Vec::new();
        eval(&self.path, obj, &mut found);
        match found.as_slice() {
            [] => Value::Null,
            [one] if self.ty == "date" => match one.as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()) {
                Some(t) => json!(crate::table::human_duration(now - t.as_second())),
                None => Value::Null,
            },
            [one] if matches!(self.ty.as_str(), "integer" | "number" | "boolean") => (*one).clone(),
            [one] => one.as_str().map_or_else(|| json!(one.to_string()), |s| json!(s)),
            many => json!(many.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect::<Vec<_>>().join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jsonpaths_crds_use_find_their_values() {
        let obj = json!({"spec": {"replicas": 3}, "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Paused", "status": "False"}]}});
        let col = |p: &str, ty: &str| from_crd(Some(&json!([{"name": "X", "type": ty, "jsonPath": p}]))).remove(0);
        assert_eq!(col(".spec.replicas", "integer").cell(&obj, 0), json!(3));
        assert_eq!(col(".status.conditions[?(@.type=='Ready')].status", "string").cell(&obj, 0), json!("True"));
        assert_eq!(col(".status.conditions[?(@.type==\"Paused\")].status", "string").cell(&obj, 0), json!("False"));
        assert_eq!(col(".status.conditions[*].type", "string").cell(&obj, 0), json!("Ready,Paused"));
        assert_eq!(col(".status.conditions[1].type", "string").cell(&obj, 0), json!("Paused"));
        assert_eq!(col(".spec.missing", "string").cell(&obj, 0), Value::Null);
        for bad in ["spec", ".a..b", ".a[?(@.x)]", ".a[1"] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
