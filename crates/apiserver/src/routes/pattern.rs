//! Path patterns of the route table: `/`-separated segments, each one of
//! - `text`: exactly that segment;
//! - `{name}`: any one segment, captured as `name`;
//! - `{name:a|b}`: one of the listed segments, captured as `name`;
//! - `{*name}`: the rest of the path (zero or more segments), captured `/`-joined; last only.
//!
//! Paths are compared by their non-empty segments, so `/version/` and `//version` are
//! `/version`.

/// The captures of `pattern` on `segs`, or `None` when it does not match.
#[must_use]
pub fn matches(pattern: &'static str, segs: &[&str]) -> Option<Vec<(&'static str, String)>> {
    let mut captures = Vec::new();
    let mut rest = segs.iter();
    for part in pattern.split('/').filter(|p| !p.is_empty()) {
        let Some(var) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) else {
            if rest.next() != Some(&part) {
                return None;
            }
            continue;
        };
        if let Some(name) = var.strip_prefix('*') {
            captures.push((name, rest.by_ref().copied().collect::<Vec<_>>().join("/")));
            break;
        }
        let seg = rest.next()?;
        let name = match var.split_once(':') {
            Some((name, allowed)) if allowed.split('|').any(|a| a == *seg) => name,
            Some(_) => return None,
            None => var,
        };
        captures.push((name, (*seg).to_owned()));
    }
    rest.next().is_none().then_some(captures)
}

/// Why `pattern` is not well formed, if it is not (the route table's test runs this).
#[must_use]
pub fn check(pattern: &str) -> Option<String> {
    if !pattern.starts_with('/') {
        return Some(format!("{pattern:?} does not start with /"));
    }
    let parts: Vec<&str> = pattern.split('/').skip(1).collect();
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            return Some(format!("{pattern:?} has an empty segment"));
        }
        let braced = part.starts_with('{') || part.ends_with('}');
        let var = part.strip_prefix('{').and_then(|p| p.strip_suffix('}'));
        match var {
            None if braced => return Some(format!("{pattern:?}: {part:?} is not a whole {{...}}")),
            None => {}
            Some(v) if v.starts_with('*') && i + 1 != parts.len() => return Some(format!("{pattern:?}: {part:?} must be last")),
            Some(v) if v.trim_start_matches('*').split(':').next().is_none_or(str::is_empty) => {
                return Some(format!("{pattern:?}: {part:?} has no name"));
            }
            Some(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &'static str, path: &str) -> Option<Vec<(&'static str, String)>> {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        matches(pattern, &segs)
    }

    fn caps(c: &[(&'static str, &str)]) -> Option<Vec<(&'static str, String)>> {
        Some(c.iter().map(|(n, v)| (*n, (*v).to_owned())).collect())
    }

    #[test]
    fn literals_match_whole_paths_only() {
        assert_eq!(m("/api/v1", "/api/v1/"), caps(&[]));
        assert_eq!(m("/api/v1", "/api"), None);
        assert_eq!(m("/api/v1", "/api/v1/pods"), None);
        assert_eq!(m("/api", "/apis"), None);
    }

    #[test]
    fn variables_capture_and_alternatives_restrict() {
        let p = "/ns/{namespace}/{plural:vms|vmis}/{name}";
        assert_eq!(m(p, "/ns/default/vms/a"), caps(&[("namespace", "default"), ("plural", "vms"), ("name", "a")]));
        assert_eq!(m(p, "/ns/default/pods/a"), None);
        assert_eq!(m(p, "/ns/default/vms"), None);
    }

    #[test]
    fn a_rest_variable_takes_zero_or_more_segments() {
        assert_eq!(m("/openapi/v3/{*path}", "/openapi/v3/apis/kubevirt.io/v1"), caps(&[("path", "apis/kubevirt.io/v1")]));
        assert_eq!(m("/openapi/v3/{*path}", "/openapi/v3"), caps(&[("path", "")]));
    }

    #[test]
    fn malformed_patterns_are_named() {
        assert_eq!(check("/a/{b}/{c:x|y}/{*d}"), None);
        assert!(check("a").is_some());
        assert!(check("/a//b").is_some());
        assert!(check("/{*a}/b").is_some());
        assert!(check("/{a").is_some());
        assert!(check("/{:x}").is_some());
    }
}
