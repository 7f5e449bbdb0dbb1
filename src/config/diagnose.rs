//! What a configuration that does not load is told: one line per key at fault, with where the
//! key came from and, for a typo, the name it was likely meant to be.

use figment::Figment;

/// A configuration that failed to load, with every error found.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

/// One line for one error: the file (or variables) the key came from, the key as written in
/// TOML (`auth.profiles."openai:work".expires`, `models.fallbacks[0]`), then the problem.
pub(super) fn describe_at(fig: &Figment, tree: &figment::value::Value, e: &figment::Error) -> String {
    use figment::value::Value;
    let mut key = String::new();
    let mut at = Some(tree);
    let mut tag = tree.tag();
    for seg in &e.path {
        match at {
            Some(Value::Array(_, items)) => {
                key.push_str(&format!("[{seg}]"));
                at = seg.parse::<usize>().ok().and_then(|i| items.get(i));
            }
            _ => {
                if !key.is_empty() {
                    key.push('.');
                }
                let bare = !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if bare {
                    key.push_str(seg)
                } else {
                    key.push_str(&format!("{seg:?}"))
                }
                at = match at {
                    Some(Value::Dict(_, d)) => d.get(seg),
                    _ => None,
                };
            }
        }
        if let Some(v) = at {
            tag = v.tag();
        }
    }
    let what = describe_kind(&e.kind);
    let origin = fig.get_metadata(tag).map(|m| match &m.source {
        Some(figment::Source::File(p)) => p.display().to_string(),
        _ => m.name.to_string(),
    });
    match (origin, key.is_empty()) {
        (Some(o), false) => format!("{o}: key `{key}`: {what}"),
        (Some(o), true) => format!("{o}: {what}"),
        (None, false) => format!("key `{key}`: {what}"),
        (None, true) => what,
    }
}

/// The problem in words; names in backticks once (figment's own text nests them).
fn describe_kind(kind: &figment::error::Kind) -> String {
    use figment::error::Kind;
    match kind {
        Kind::Message(m) => m.clone(),
        Kind::UnknownField(found, expected) => unknown("unknown key", found, expected),
        Kind::UnknownVariant(found, expected) => unknown(&format!("unknown value `{found}`"), found, expected),
        Kind::MissingField(f) => format!("missing `{f}`, which is required"),
        Kind::DuplicateField(f) => format!("`{f}` is given twice"),
        Kind::InvalidType(found, expected) => format!("expected {expected}, found {found}"),
        Kind::InvalidValue(found, expected) => format!("invalid value {found}, expected {expected}"),
        other => other.to_string(),
    }
}

/// `what`, then the closest valid name when one is close enough, else the valid names.
fn unknown(what: &str, found: &str, expected: &[&str]) -> String {
    if let Some(near) = did_you_mean(found, expected) {
        return format!("{what}; did you mean `{near}`?");
    }
    let names: Vec<String> = expected.iter().map(|n| format!("`{n}`")).collect();
    match names.as_slice() {
        [] => what.to_string(),
        [one] => format!("{what}; expected {one}"),
        [a, b] => format!("{what}; expected {a} or {b}"),
        [init @ .., last] => format!("{what}; expected one of {} or {last}", init.join(", ")),
    }
}

/// The valid name nearest to `found` (edit distance, transpositions counting once), when it is
/// a likely typo: at most one edit per three characters, and at least one.
pub fn did_you_mean<'a>(found: &str, valid: &[&'a str]) -> Option<&'a str> {
    let found = found.to_ascii_lowercase();
    let limit = (found.chars().count() / 3).max(1);
    valid
        .iter()
        .map(|v| (strsim::osa_distance(&found, v), *v))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// One line per figment error (a file that does not parse): the file (or variable) and the key
/// at fault, then the problem.
pub(super) fn describe(err: figment::Error) -> Vec<String> {
    err.into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let origin = e.metadata.as_ref().map(|m| match &m.source {
                Some(figment::Source::File(p)) => p.display().to_string(),
                _ => m.name.to_string(),
            });
            let what = describe_kind(&e.kind);
            match (origin, key.is_empty()) {
                (Some(o), false) => format!("{o}: key `{key}`: {what}"),
                (Some(o), true) => format!("{o}: {what}"),
                (None, false) => format!("key `{key}`: {what}"),
                (None, true) => what,
            }
        })
        .collect()
}
