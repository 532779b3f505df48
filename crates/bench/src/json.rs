//! Just enough JSON to write the results file (the workspace has no serde, on purpose).

use std::fmt::Write as _;

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

    /// The text, indented by two spaces per level, ending without a newline.
    pub fn to_pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        match self {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Num(x) => write_number(out, *x),
            Value::Str(s) => write_string(out, s),
            Value::Arr(items) if items.is_empty() => out.push_str("[]"),
            Value::Obj(fields) if fields.is_empty() => out.push_str("{}"),
            Value::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    item.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push(']');
            }
            Value::Obj(fields) => {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    write_string(out, key);
                    out.push_str(": ");
                    value.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push('}');
            }
        }
    }
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write_number(out: &mut String, x: f64) {
    if !x.is_finite() {
        out.push_str("null");
    } else if x == x.trunc() && x.abs() < 1e15 {
        // Integral values print without a fraction (and -0 as 0).
        let _ = write!(out, "{}", x as i64);
    } else {
        // Rust's shortest round-trip form is valid JSON for finite values.
        let _ = write!(out, "{x}");
    }
}

/// Writes `s` as a JSON string literal: quotes, backslashes and control characters escaped.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
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
        let mut out = String::new();
        write_string(&mut out, s);
        out
    }

    #[test]
    fn strings_escape_quotes_backslashes_and_controls() {
        assert_eq!(string("plain"), "\"plain\"");
        assert_eq!(string("a\"b"), "\"a\\\"b\"");
        assert_eq!(string("C:\\x"), "\"C:\\\\x\"");
        assert_eq!(string("l1\nl2\tx\r"), "\"l1\\nl2\\tx\\r\"");
        assert_eq!(string("\u{1}\u{1f}\u{7f}"), "\"\\u0001\\u001f\\u007f\"");
        assert_eq!(string("\u{8}\u{c}"), "\"\\b\\f\"");
        // Non-ASCII text is valid JSON as UTF-8 and stays as it is.
        assert_eq!(string("H200 µs"), "\"H200 µs\"");
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
