//! The results file's JSON: a small value type that keeps fields in insertion order, written by
//! serde_json.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// A JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number; a non-finite one is written as `null` (JSON has no NaN).
    Num(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Value>),
    /// An object, keys in insertion order.
    Obj(Vec<(String, Value)>),
}

impl Value {
    /// An empty object to [`Value::with`] fields into.
    pub fn object() -> Self {
        Value::Obj(Vec::new())
    }

    /// This object with one more field (no effect on non-objects).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        if let Value::Obj(fields) = &mut self {
            fields.push((key.to_owned(), value.into()));
        }
        self
    }

    /// The text, indented by two spaces per level, ending without a newline (written by
    /// serde_json).
    pub fn to_pretty(&self) -> String {
        // Serializing this type cannot fail: every key is a string and every number finite or
        // written as null.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("null /* {e} */"))
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Num(x) if !x.is_finite() => serializer.serialize_unit(),
            // Integral values print without a fraction or exponent (and -0 as 0), as they did
            // before serde_json wrote this file (which would write 1e20 as `1e20`).
            Value::Num(x) if *x == x.trunc() && x.abs() < 1e38 => {
                serializer.serialize_i128(*x as i128)
            }
            Value::Num(x) => serializer.serialize_f64(*x),
            Value::Str(s) => serializer.serialize_str(s),
            Value::Arr(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Obj(fields) => {
                let mut map = serializer.serialize_map(Some(fields.len()))?;
                for (key, value) in fields {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Num(x)
    }
}
impl From<u64> for Value {
    fn from(x: u64) -> Self {
        Value::Num(x as f64)
    }
}
impl From<usize> for Value {
    fn from(x: usize) -> Self {
        Value::Num(x as f64)
    }
}
impl From<i32> for Value {
    fn from(x: i32) -> Self {
        Value::Num(f64::from(x))
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}
impl From<Vec<Value>> for Value {
    fn from(items: Vec<Value>) -> Self {
        Value::Arr(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(s: &str) -> String {
        Value::from(s).to_pretty()
    }

    /// Parses `text` back, so a test sees what a JSON reader sees.
    fn parse(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn strings_escape_quotes_backslashes_and_controls() {
        assert_eq!(string("plain"), "\"plain\"");
        assert_eq!(string("a\"b"), "\"a\\\"b\"");
        assert_eq!(string("C:\\x"), "\"C:\\\\x\"");
        assert_eq!(string("l1\nl2\tx\r"), "\"l1\\nl2\\tx\\r\"");
        assert_eq!(string("\u{1}\u{1f}"), "\"\\u0001\\u001f\"");
        assert_eq!(string("\u{8}\u{c}"), "\"\\b\\f\"");
        // Non-ASCII text is valid JSON as UTF-8 and stays as it is.
        assert_eq!(string("H200 µs"), "\"H200 µs\"");
    }

    #[test]
    fn hostile_strings_round_trip_as_keys_and_values() {
        let hostile = [
            "\"}], \"injected\": true, {\"",
            "back\\slash\\\"quote",
            "\u{0}nul\u{1b}[31mescape\u{7f}del",
            "line\nbreak\r\n\u{2028}separator\u{2029}",
            "/* not a comment */ </script>",
            "emoji 🚀 and \u{fffd} replacement",
        ];
        for s in hostile {
            let v = Value::object()
                .with(s, s)
                .with("list", vec![Value::from(s)]);
            let back = parse(&v.to_pretty());
            let obj = back.as_object().expect("an object");
            assert_eq!(obj.len(), 2, "{s:?} added or lost a field: {back}");
            assert_eq!(obj[s], serde_json::Value::from(s));
            assert_eq!(obj["list"][0], serde_json::Value::from(s));
        }
    }

    #[test]
    fn numbers_are_plain_and_non_finite_is_null() {
        let text = |x: f64| Value::Num(x).to_pretty();
        assert_eq!(text(3.0), "3");
        assert_eq!(text(-0.0), "0");
        assert_eq!(text(1.5), "1.5");
        assert_eq!(text(0.1), "0.1");
        assert_eq!(text(1e20), "100000000000000000000");
        assert_eq!(text(f64::NAN), "null");
        assert_eq!(text(f64::INFINITY), "null");
    }

    #[test]
    fn nested_values_are_indented() {
        let v = Value::object()
            .with("name", "case \"1\"")
            .with("n", 3u64)
            .with("ok", true)
            .with("none", Option::<f64>::None)
            .with("list", vec![Value::Num(1.0), Value::object()])
            .with("empty", Value::Arr(vec![]));
        assert_eq!(
            v.to_pretty(),
            "{\n  \"name\": \"case \\\"1\\\"\",\n  \"n\": 3,\n  \"ok\": true,\n  \"none\": null,\n  \
             \"list\": [\n    1,\n    {}\n  ],\n  \"empty\": []\n}"
        );
    }
}
