//! Optimistic concurrency: a resource's `ETag` is its row version, and a write that names the version
//! it read (`If-Match`) is refused with `412 precondition_failed` when another write came first. The
//! check runs under the write's row lock, so two writers that read one version cannot both succeed.

/// The strong entity tag of a row version: `"7"`.
pub fn etag(row_version: i64) -> String {
    format!("\"{row_version}\"")
}

/// The tag of an environment: its own version and its inventory's (rows are only ever added or updated,
/// and every change bumps one version, so the sum of versions never repeats).
pub fn environment_etag(row_version: i64, repo_versions: impl IntoIterator<Item = i64>) -> String {
    let repos: i64 = repo_versions.into_iter().sum();
    format!("\"{row_version}.{repos}\"")
}

/// A parsed `If-Match` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// No header: the write is unconditional.
    Absent,
    /// `*`: any current version.
    Any,
    /// Strong tags; weak ones (`W/"..."`) never match a strong comparison (RFC 9110 13.1.1).
    Tags(Vec<String>),
}

impl IfMatch {
    /// Parses the header value; `None` when it is not a valid `If-Match`.
    pub fn parse(header: Option<&str>) -> Option<IfMatch> {
        let Some(value) = header.map(str::trim) else {
            return Some(IfMatch::Absent);
        };
        if value == "*" {
            return Some(IfMatch::Any);
        }
        let mut tags = Vec::new();
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let opaque = part.strip_prefix("W/").unwrap_or(part);
            if opaque.len() < 2 || !opaque.starts_with('"') || !opaque.ends_with('"') {
                return None;
            }
            if !part.starts_with("W/") {
                tags.push(part.to_string());
            }
        }
        if tags.is_empty() && !value.contains("W/") {
            return None;
        }
        Some(IfMatch::Tags(tags))
    }

    /// Whether a resource whose current tag is `current` satisfies the precondition.
    pub fn admits(&self, current: &str) -> bool {
        match self {
            IfMatch::Absent | IfMatch::Any => true,
            IfMatch::Tags(tags) => tags.iter().any(|t| t == current),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_compares_strongly() {
        assert_eq!(IfMatch::parse(None), Some(IfMatch::Absent));
        assert!(IfMatch::parse(Some("*")).unwrap().admits("\"3\""));
        let m = IfMatch::parse(Some("\"2\", \"3\"")).unwrap();
        assert!(m.admits("\"3\""));
        assert!(!m.admits("\"4\""));
        assert!(!IfMatch::parse(Some("W/\"3\"")).unwrap().admits("\"3\""));
        assert_eq!(IfMatch::parse(Some("3")), None);
        assert_eq!(IfMatch::parse(Some("")), None);
        assert_eq!(etag(3), "\"3\"");
        assert_eq!(environment_etag(2, [1, 3]), "\"2.4\"");
    }
}
