//! Reading what a probing pod printed: a shell loop in a test pod runs commands in rounds and
//! ends each with a line `@@ <round> <name> <exit code>` after the command's output. These
//! helpers read the container's CRI log file (under the test edge's pod-logs directory) and
//! split it into those rounds.

use std::path::Path;

/// One probe result: the round, the command's name, its exit code and its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub round: u64,
    pub name: String,
    pub rc: i32,
    pub output: String,
}

/// The log of `container` (first instance) of pod `ns/pod` with `uid`, under edged's pod-logs
/// directory `logs` (empty until it exists).
pub fn container_log(logs: &Path, ns: &str, pod: &str, uid: &str, container: &str) -> String {
    let p = logs
        .join(format!("{ns}_{pod}_{uid}"))
        .join(container)
        .join("0.log");
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Every completed round in a CRI log (`<time> <stream> <P|F> <content>` lines).
pub fn rounds(log: &str) -> Vec<Round> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in log.lines() {
        let content = line.splitn(4, ' ').nth(3).unwrap_or_default();
        if let Some(rest) = content.strip_prefix("@@ ") {
            let f: Vec<&str> = rest.split(' ').collect();
            if let [round, name, rc] = f[..] {
                out.push(Round {
                    round: round.parse().unwrap_or(0),
                    name: name.to_string(),
                    rc: rc.parse().unwrap_or(-1),
                    output: std::mem::take(&mut current),
                });
            }
        } else {
            current.push_str(content);
            current.push('\n');
        }
    }
    out
}

/// The last round of command `name`.
pub fn last(log: &str, name: &str) -> Option<Round> {
    rounds(log).into_iter().rev().find(|r| r.name == name)
}

/// The rounds of command `name` after round `after`.
pub fn since(log: &str, name: &str, after: u64) -> Vec<Round> {
    rounds(log)
        .into_iter()
        .filter(|r| r.name == name && r.round > after)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_carry_the_output_printed_before_their_marker() {
        let log = "t stdout F hello\nt stdout F @@ 1 get 0\nt stdout F oops\nt stderr F more\nt stdout F @@ 1 put 1\nt stdout F @@ 2 get 0\n";
        let r = rounds(log);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].output, "hello\n");
        assert_eq!((r[1].name.as_str(), r[1].rc), ("put", 1));
        assert_eq!(r[1].output, "oops\nmore\n");
        assert_eq!(last(log, "get").unwrap().round, 2);
        assert_eq!(since(log, "get", 1).len(), 1);
    }
}
