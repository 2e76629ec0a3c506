//! TOML documents (the topology, the run configuration) parsed so that every error names the
//! field it is about and the line it is on: `detector.modules (line 2, column 11): invalid
//! type: string "two", expected u16`, not the bare serde message.

use serde::de::DeserializeOwned;
use std::fmt;

/// A TOML document that did not parse into the expected type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TomlError {
    /// Dotted path of the field (`detector.modules`); empty for errors of the syntax or of
    /// the document as a whole.
    pub field: String,
    /// 1-based line and column of the offending text, when the parser knows it.
    pub at: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for TomlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.field.is_empty(), self.at) {
            (false, Some((l, c))) => write!(f, "{} (line {l}, column {c}): {}", self.field, self.message),
            (false, None) => write!(f, "{}: {}", self.field, self.message),
            (true, Some((l, c))) => write!(f, "line {l}, column {c}: {}", self.message),
            (true, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TomlError {}

/// Parses `text` as a `T`, naming the field of the first error.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, TomlError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let at = inner.span().map(|s| line_column(text, s.start));
        TomlError { field: if field == "." { String::new() } else { field }, at, message: inner.message().trim().to_string() }
    })
}

/// 1-based line and column (in characters) of byte offset `at` of `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        detector: Detector,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Detector {
        #[serde(default)]
        modules: u16,
    }

    #[test]
    fn a_wrong_type_names_the_field_and_the_line() {
        let e = parse::<Doc>("# comment\n[detector]\nmodules = \"two\"\n").unwrap_err();
        assert_eq!(e.field, "detector.modules");
        assert_eq!(e.at, Some((3, 11)));
        assert!(e.message.contains("invalid type: string \"two\", expected u16"), "{e}");
        assert_eq!(e.to_string(), format!("detector.modules (line 3, column 11): {}", e.message));
    }

    #[test]
    fn unknown_fields_and_syntax_errors_say_where() {
        let e = parse::<Doc>("[detector]\nmodulez = 2\n").unwrap_err();
        assert!(e.to_string().contains("modulez"), "{e}");
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse::<Doc>("[detector\n").unwrap_err();
        assert!(e.to_string().starts_with("line 1"), "{e}");
        assert_eq!(parse::<Doc>("[detector]\nmodules = 3\n").unwrap().detector.modules, 3);
    }
}
