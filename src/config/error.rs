//! What a config that cannot be used is reported as: [`ConfigError`], naming the file,
//! line, column and key. Errors serde finds carry their place; errors found while checking
//! the parsed values ([`CompileError`]) name their key path, found in the document again
//! to give the place.

use super::locate::locate;

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

/// An error found after parsing, while a section is checked and built: placed by its key
/// path in the document ([`super::locate`]).
#[derive(Debug)]
pub(super) struct CompileError {
    /// The offending key, e.g. `routes[1].name`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// Text inside the key's value the error is about (one item of a list), placed at
    /// rather than at the key when the file writes it there.
    pub within: Option<String>,
}

impl CompileError {
    /// An error at `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
            within: None,
        }
    }

    /// The same error, placed at `value` where the key's value holds it.
    pub fn within(self, value: impl Into<String>) -> Self {
        Self {
            within: Some(value.into()),
            ..self
        }
    }

    /// The error as reported, placed where `text` writes its key (or the nearest section
    /// of it that `text` writes).
    pub fn place(self, text: &str, file: &str) -> ConfigError {
        let (line, column) = locate(text, &self.key, self.within.as_deref());
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
