//! A tokenizer for Rust source that is just good enough to find module paths: it drops
//! comments (doc comments included), lifetimes and numbers, keeps string literals as one token
//! each (for `#[path = "..."]`), and reports identifiers, `::` and single punctuation
//! characters with their line. It never fails: text it does not understand becomes
//! punctuation, which the graph builder ignores.

/// One token's kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword (`r#name` is given as `name`).
    Ident(String),
    /// A string literal's contents, escapes left as written.
    Str(String),
    /// `::`.
    PathSep,
    /// Any other single character: `{`, `}`, `;`, `,`, `*`, `#`, `$`, ...
    Punct(char),
}

/// A token and the line (1-based) it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// What it is.
    pub tok: Tok,
    /// Where it starts.
    pub line: usize,
}

/// Splits `text` into tokens.
pub fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut lexer = Lexer {
        chars: &chars,
        at: 0,
        line: 1,
        tokens: Vec::new(),
    };
    lexer.run();
    lexer.tokens
}

struct Lexer<'a> {
    chars: &'a [char],
    at: usize,
    line: usize,
    tokens: Vec<Token>,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    /// Moves past one character, counting lines.
    fn bump(&mut self) {
        if self.peek(0) == Some('\n') {
            self.line += 1;
        }
        self.at += 1;
    }

    fn push(&mut self, tok: Tok, line: usize) {
        self.tokens.push(Token { tok, line });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                _ if c.is_whitespace() => self.bump(),
                '/' if self.peek(1) == Some('/') => self.line_comment(),
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => {
                    self.bump();
                    let s = self.quoted();
                    self.push(Tok::Str(s), line);
                }
                '\'' => self.quote_or_lifetime(),
                ':' if self.peek(1) == Some(':') => {
                    self.bump();
                    self.bump();
                    self.push(Tok::PathSep, line);
                }
                _ if c.is_ascii_digit() => {
                    while self.peek(0).is_some_and(is_ident_char) {
                        self.bump();
                    }
                }
                _ if is_ident_start(c) => self.ident_or_prefixed_literal(),
                _ => {
                    self.bump();
                    self.push(Tok::Punct(c), line);
                }
            }
        }
    }

    fn line_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.bump();
        }
    }

    /// A block comment; they nest.
    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while let Some(c) = self.peek(0) {
            if c == '/' && self.peek(1) == Some('*') {
                depth += 1;
                self.bump();
            } else if c == '*' && self.peek(1) == Some('/') {
                depth -= 1;
                self.bump();
                if depth == 0 {
                    self.bump();
                    return;
                }
            }
            self.bump();
        }
    }

    /// The rest of a string with escapes, after its opening quote; consumes the closing one.
    fn quoted(&mut self) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek(0) {
            self.bump();
            match c {
                '"' => break,
                '\\' => {
                    s.push(c);
                    if let Some(next) = self.peek(0) {
                        s.push(next);
                        self.bump();
                    }
                }
                _ => s.push(c),
            }
        }
        s
    }

    /// A raw string from its `#`s (the `r` consumed): `#*"..."#*`.
    fn raw_string(&mut self) -> String {
        let mut hashes = 0usize;
        while self.peek(0) == Some('#') {
            hashes += 1;
            self.bump();
        }
        // The opening quote.
        self.bump();
        let mut s = String::new();
        while let Some(c) = self.peek(0) {
            if c == '"' && (1..=hashes).all(|k| self.peek(k) == Some('#')) {
                for _ in 0..=hashes {
                    self.bump();
                }
                break;
            }
            s.push(c);
            self.bump();
        }
        s
    }

    /// `'x'`, `'\n'`, `'\u{..}'` (skipped) or a lifetime or label `'a` (skipped).
    fn quote_or_lifetime(&mut self) {
        self.bump();
        if self.peek(0) == Some('\\') {
            while let Some(c) = self.peek(0) {
                self.bump();
                if c == '\\' {
                    self.bump();
                } else if c == '\'' {
                    return;
                }
            }
        } else if self.peek(1) == Some('\'') {
            self.bump();
            self.bump();
        } else {
            while self.peek(0).is_some_and(is_ident_char) {
                self.bump();
            }
        }
    }

    /// An identifier, or a literal with a prefix: `r"..."`, `r#"..."#`, `b"..."`, `br"..."`,
    /// `c"..."`, `cr"..."`, `b'x'`, or a raw identifier `r#name`.
    fn ident_or_prefixed_literal(&mut self) {
        let line = self.line;
        let start = self.at;
        while self.peek(0).is_some_and(is_ident_char) {
            self.bump();
        }
        let word: String = self.chars[start..self.at].iter().collect();
        let next = self.peek(0);
        match (word.as_str(), next) {
            ("b" | "c", Some('"')) => {
                self.bump();
                let s = self.quoted();
                self.push(Tok::Str(s), line);
            }
            ("b", Some('\'')) => self.quote_or_lifetime(),
            ("r" | "br" | "cr", Some('"')) => {
                let s = self.raw_string();
                self.push(Tok::Str(s), line);
            }
            ("r" | "br" | "cr", Some('#')) if matches!(self.peek(1), Some('"' | '#')) => {
                let s = self.raw_string();
                self.push(Tok::Str(s), line);
            }
            ("r", Some('#')) if self.peek(1).is_some_and(is_ident_start) => {
                self.bump();
                let start = self.at;
                while self.peek(0).is_some_and(is_ident_char) {
                    self.bump();
                }
                let raw: String = self.chars[start..self.at].iter().collect();
                self.push(Tok::Ident(raw), line);
            }
            _ => self.push(Tok::Ident(word), line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(text: &str) -> Vec<String> {
        tokenize(text)
            .into_iter()
            .filter_map(|t| match t.tok {
                Tok::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_chars_and_lifetimes_hide_their_contents() {
        let text = "a // crate::x\n/* crate::y /* nested */ crate::z */ b \"crate::s\" \
                    r#\"crate::\"q\"#  '{' '\\'' fn f<'a>(x: &'a str) b'}' br\"crate\" c";
        assert_eq!(
            idents(text),
            ["a", "b", "fn", "f", "x", "str", "c"].map(String::from)
        );
    }

    #[test]
    fn lines_count_through_comments_and_strings() {
        let tokens = tokenize("/* one\ntwo */ \"three\nfour\"\nfive");
        assert_eq!(tokens.last().map(|t| t.line), Some(4));
        assert_eq!(tokens[0].tok, Tok::Str("three\nfour".into()));
    }

    #[test]
    fn path_separators_and_raw_identifiers() {
        let tokens: Vec<Tok> = tokenize("crate::r#type::{a, 1u8}")
            .into_iter()
            .map(|t| t.tok)
            .collect();
        assert_eq!(
            tokens,
            [
                Tok::Ident("crate".into()),
                Tok::PathSep,
                Tok::Ident("type".into()),
                Tok::PathSep,
                Tok::Punct('{'),
                Tok::Ident("a".into()),
                Tok::Punct(','),
                Tok::Punct('}'),
            ]
        );
    }
}
