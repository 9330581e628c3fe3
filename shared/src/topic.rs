//! MQTT topic names and filters (MQTT 3.1.1 §4.7), as the edge's eventbus subscribes to them
//! and the cloud router matches the topics edges upload on.

/// Longest topic MQTT can carry (a two-byte length prefix).
pub const MAX_TOPIC_LEN: usize = 65_535;

/// Whether `topic` (a concrete topic name) matches `filter` (MQTT 3.1.1 §4.7: `+` one level,
/// `#` this level and all below; filters that start with a wildcard do not match `$` topics).
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut levels = topic.split('/');
    for f in filter.split('/') {
        if f == "#" {
            return true;
        }
        match levels.next() {
            Some(t) if f == "+" || f == t => {}
            _ => return false,
        }
    }
    levels.next().is_none()
}

/// A filter a client may subscribe to: non-empty, `#` only as the last level, wildcards only
/// as whole levels, no NUL.
pub fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.len() > MAX_TOPIC_LEN || filter.contains('\0') {
        return false;
    }
    let levels: Vec<&str> = filter.split('/').collect();
    levels.iter().enumerate().all(|(i, level)| match *level {
        "#" => i == levels.len() - 1,
        "+" => true,
        l => !l.contains(['+', '#']),
    })
}

/// A topic one may publish to: non-empty, no wildcards, no NUL.
pub fn valid_topic(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= MAX_TOPIC_LEN && !topic.contains(['+', '#', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_matching_follows_mqtt() {
        assert!(matches("a/+/c", "a/b/c"));
        assert!(!matches("a/+/c", "a/b/d/c"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "a/b"));
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(matches("a//b", "a//b"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(!matches("a/b/c", "a/b"));
    }

    #[test]
    fn filters_and_topics_are_validated() {
        assert!(valid_filter("a/+/#"));
        assert!(valid_filter("#"));
        assert!(!valid_filter(""));
        assert!(!valid_filter("a/#/b"));
        assert!(!valid_filter("a/b+"));
        assert!(!valid_filter("a/#b"));
        assert!(valid_topic("a/b"));
        assert!(!valid_topic("a/+"));
        assert!(!valid_topic(""));
        assert!(!valid_topic("a\0b"));
    }
}
