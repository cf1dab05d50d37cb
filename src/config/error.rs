//! What a config that cannot be used is reported as: [`ConfigError`], naming the file,
//! line, column and key. Errors serde finds carry their place; errors found while checking
//! the parsed values ([`CompileError`]) name a piece of text, found in the file again to
//! give the place.

/// A config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Read {
        /// Path as given.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid config.
    #[error("{file}:{line}:{column}: {key}: {message}")]
    Invalid {
        /// Path as given.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The offending key, e.g. `routes[1].ttl`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// An error found after parsing, while a section is checked and built.
#[derive(Debug)]
pub(super) struct CompileError {
    /// The offending key, e.g. `routes[1].name`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// Text whose first appearance in the file is reported as the place.
    pub needle: String,
    /// Text the needle is looked for after (a route's `name:`), when the needle alone is
    /// not unique in the file.
    pub anchor: Option<String>,
}

impl CompileError {
    /// An error at `key`, placed where `needle` first appears.
    pub fn new(
        key: impl Into<String>,
        message: impl Into<String>,
        needle: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
            needle: needle.into(),
            anchor: None,
        }
    }

    /// The same error, placed at the needle's first appearance after `anchor`'s (at the
    /// anchor when the needle does not follow it).
    pub fn after(self, anchor: impl Into<String>) -> Self {
        Self {
            anchor: Some(anchor.into()),
            ..self
        }
    }

    /// The error as reported, placed where its needle first appears in `text`.
    pub fn place(self, text: &str, file: &str) -> ConfigError {
        let (line, column) = match &self.anchor {
            Some(anchor) => locate_after(text, anchor, &self.needle),
            None => locate(text, &self.needle),
        };
        ConfigError::Invalid {
            file: file.to_owned(),
            line,
            column,
            key: self.key,
            message: self.message,
        }
    }
}

/// A serde error as reported: its place, its key (`(top)` for the whole file), and its
/// message without the place and key serde already wrote into it.
pub(super) fn from_serde(
    e: serde_path_to_error::Error<serde_yaml_ng::Error>,
    file: &str,
) -> ConfigError {
    let key = e.path().to_string();
    let inner = e.into_inner();
    let (line, column) = inner.location().map_or((1, 1), |l| (l.line(), l.column()));
    ConfigError::Invalid {
        file: file.to_owned(),
        line,
        column,
        message: tidy_message(&inner.to_string(), &key),
        key: if key == "." { "(top)".into() } else { key },
    }
}

/// serde_yaml_ng writes "`routes[0]`: unknown field … at line L column C"; we print the
/// place and key in front instead, so both are cut from the message.
fn tidy_message(message: &str, key: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    };
    match message.split_once(": ") {
        Some((path, rest)) if !path.is_empty() && key.starts_with(path) => rest.to_owned(),
        _ => message.to_owned(),
    }
}

/// The line and column where `needle` first appears, for errors found after parsing.
fn locate(text: &str, needle: &str) -> (usize, usize) {
    if needle.is_empty() {
        return (1, 1);
    }
    for (i, line) in text.lines().enumerate() {
        if let Some(col) = line.find(needle) {
            return (i + 1, col + 1);
        }
    }
    (1, 1)
}

/// The line and column of `needle`'s first appearance after `anchor`'s first, else of
/// `anchor`'s.
fn locate_after(text: &str, anchor: &str, needle: &str) -> (usize, usize) {
    let Some(start) = text.find(anchor).filter(|_| !anchor.is_empty()) else {
        return locate(text, needle);
    };
    let at = text[start..].find(needle).map_or(start, |i| start + i);
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    (text[..at].matches('\n').count() + 1, at - line_start + 1)
}
