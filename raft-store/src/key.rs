//! Key normalization, exactly as TensorFlow's coordination service does it.
//!
//! Keys are paths: repeated `/` collapse to one and leading and trailing `/` are dropped, so
//! `/a//b/` and `a/b` name the same entry. Every key is normalized before it is proposed, and the
//! state machine normalizes again so that its behaviour does not depend on the caller.

/// Returns `key` with runs of `/` collapsed and leading/trailing `/` removed, without copying a
/// key that is already normal.
pub fn normalized(key: &str) -> std::borrow::Cow<'_, str> {
    let normal = !key.starts_with('/') && !key.ends_with('/') && !key.contains("//");
    if normal {
        std::borrow::Cow::Borrowed(key)
    } else {
        std::borrow::Cow::Owned(normalize_key(key))
    }
}

/// Returns `key` with runs of `/` collapsed and leading/trailing `/` removed.
pub fn normalize_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for part in key.split('/').filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(part);
    }
    out
}

/// The smallest string greater than every key under directory `dir` (which is already normalized
/// and non-empty): keys under `dir` are exactly those in `[dir + "/", dir_end(dir))`.
pub fn dir_range(dir: &str) -> (String, String) {
    // '0' is the character right after '/', so "dir0" bounds every "dir/..." key.
    (format!("{dir}/"), format!("{dir}0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_and_strips_slashes() {
        assert_eq!(normalize_key("/a//b/"), "a/b");
        assert_eq!(normalize_key("a/b"), "a/b");
        assert_eq!(normalize_key("///"), "");
        assert_eq!(normalize_key(""), "");
        assert_eq!(normalize_key("x"), "x");
        assert_eq!(normalize_key("//x///y//z"), "x/y/z");
        for k in ["/a//b/", "a/b", "///", "", "x", "//x///y//z", "a/", "/a"] {
            assert_eq!(normalized(k), normalize_key(k), "{k:?}");
        }
    }

    #[test]
    fn dir_range_bounds_children_only() {
        let (lo, hi) = dir_range("a/b");
        for k in ["a/b/c", "a/b/c/d", "a/b/"] {
            assert!(k >= lo.as_str() && k < hi.as_str(), "{k} should be inside");
        }
        for k in ["a/b", "a/bc", "a/b0", "a/c", "a/a/z"] {
            assert!(
                !(k >= lo.as_str() && k < hi.as_str()),
                "{k} should be outside"
            );
        }
    }
}
