//! Specs read from files: the I/O the pure iso8583 crate leaves to the
//! switch. Reached as `crate::iso8583::SpecFiles`; bring it into scope to
//! call `Spec::resolve` and `Spec::load`.

use std::path::Path;

use isoswitch_iso8583::{Spec, SpecError};

/// Loading a spec by builtin name or from a file.
pub trait SpecFiles: Sized {
    /// Reads, parses and validates a spec file.
    fn load(path: impl AsRef<Path>) -> Result<Self, SpecError>;
    /// A builtin spec by name, else a spec file by path.
    fn resolve(name_or_path: &str) -> Result<Self, SpecError>;
}

impl SpecFiles for Spec {
    fn load(path: impl AsRef<Path>) -> Result<Spec, SpecError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Io {
            spec: origin.clone(),
            source,
        })?;
        Spec::from_toml_named(&text, &origin)
    }

    fn resolve(name_or_path: &str) -> Result<Spec, SpecError> {
        if let Some(spec) = Spec::builtin_checked(name_or_path) {
            return spec;
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            return Spec::load(path);
        }
        Err(SpecError::NotFound {
            name_or_path: name_or_path.to_string(),
            builtins: Spec::builtin_names().collect::<Vec<_>>().join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builtin_by_name_a_file_by_path_and_neither_is_not_found() {
        assert!(Spec::resolve("cups").is_ok());
        assert!(matches!(
            Spec::resolve("/no/such/spec.toml"),
            Err(SpecError::NotFound { .. })
        ));
        let path = std::env::temp_dir().join(format!("isoswitch-spec-{}.toml", std::process::id()));
        let text = Spec::builtin_names()
            .find(|n| *n == "iso87ascii")
            .map(|_| include_str!("../specs/iso87ascii.toml"))
            .unwrap_or_default();
        std::fs::write(&path, text).unwrap();
        let spec = Spec::resolve(path.to_str().unwrap()).unwrap();
        assert_eq!(spec.name(), "iso87ascii");
        let _ = std::fs::remove_file(path);
    }
}
