//! The `path` of a rest source: segments matched one by one against the request, a `{name}`
//! part matching what KubeEdge's `{param}` regex matches (`[-A-Za-z0-9+&@#%?=~_|!:,.;]+`).
//!
//! KubeEdge matches an unanchored regular expression against the whole request URI, so its
//! rule `/default/web` also takes `/<node>/default/webpage` and `/<node>/x/default/web`. Here a
//! rule matches whole segments after `/<node>/<its namespace>/`, and the most specific rule
//! wins: the most segments, then the most literal ones.

/// A compiled path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment(Vec<Piece>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Param,
}

/// What a request's path left after a rule's path: the parameter KubeEdge appends to the
/// target (`/rest…` and the query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathMatch {
    /// Segments the rule consumed.
    pub consumed: usize,
    /// Its specificity: `(segments, literal segments)`.
    pub rank: (usize, usize),
}

fn param_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-+&@#%?=~_|!:,.;".contains(c)
}

impl PathPattern {
    /// Parses a rule's `path` (`/a/{id}/b`; surrounding `/` are ignored, as KubeEdge trims them).
    pub fn parse(path: &str) -> Result<Self, String> {
        let trimmed = path.trim_matches('/');
        if trimmed.is_empty() {
            return Ok(PathPattern { segments: vec![] });
        }
        let segments = trimmed
            .split('/')
            .map(|s| parse_segment(s).map_err(|e| format!("path {path:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PathPattern { segments })
    }

    /// Matches the start of `request` (its segments after `/<node>/<namespace>/`).
    pub fn match_prefix(&self, request: &[&str]) -> Option<PathMatch> {
        if request.len() < self.segments.len() {
            return None;
        }
        let all = self
            .segments
            .iter()
            .zip(request)
            .all(|(seg, r)| seg.matches(r));
        all.then(|| PathMatch {
            consumed: self.segments.len(),
            rank: (
                self.segments.len(),
                self.segments.iter().filter(|s| s.is_literal()).count(),
            ),
        })
    }
}

fn parse_segment(s: &str) -> Result<Segment, String> {
    if s.is_empty() {
        return Err("empty segment".into());
    }
    let mut pieces = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else {
            return Err(format!("unclosed {{ in {s:?}"));
        };
        let name = &rest[open + 1..close];
        if name.is_empty() || !name.chars().all(param_char) {
            return Err(format!("bad parameter {{{name}}}"));
        }
        if open > 0 {
            pieces.push(Piece::Literal(rest[..open].to_string()));
        }
        if pieces.last() == Some(&Piece::Param) {
            return Err(format!("two parameters in a row in {s:?}"));
        }
        pieces.push(Piece::Param);
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Literal(rest.to_string()));
    }
    Ok(Segment(pieces))
}

impl Segment {
    fn is_literal(&self) -> bool {
        !self.0.contains(&Piece::Param)
    }

    fn matches(&self, s: &str) -> bool {
        match_pieces(&self.0, s)
    }
}

fn match_pieces(pieces: &[Piece], s: &str) -> bool {
    match pieces.split_first() {
        None => s.is_empty(),
        Some((Piece::Literal(l), rest)) => s
            .strip_prefix(l.as_str())
            .is_some_and(|tail| match_pieces(rest, tail)),
        Some((Piece::Param, rest)) => {
            // One or more parameter characters, then the rest (no two params in a row, so the
            // next piece is a literal or the end: try every split).
            (1..=s.len())
                .filter(|&i| s.is_char_boundary(i))
                .take_while(|&i| s[..i].chars().all(param_char))
                .any(|i| match_pieces(rest, &s[i..]))
        }
    }
}

/// KubeEdge's join of a target's fixed part and the request's parameter:
/// `TrimSuffix(base, "/") + "/" + TrimPrefix(param, "/")` when there is a parameter.
pub fn join(base: &str, param: &str) -> String {
    if param.is_empty() {
        return base.to_string();
    }
    format!(
        "{}/{}",
        base.strip_suffix('/').unwrap_or(base),
        param.strip_prefix('/').unwrap_or(param)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(p: &str) -> Vec<&str> {
        p.split('/').filter(|s| !s.is_empty()).collect()
    }

    #[test]
    fn literal_paths_match_whole_segments() {
        let p = PathPattern::parse("/web").unwrap();
        assert_eq!(p.match_prefix(&segs("web")).unwrap().consumed, 1);
        assert_eq!(p.match_prefix(&segs("web/a/b")).unwrap().consumed, 1);
        assert!(p.match_prefix(&segs("webpage")).is_none());
        assert!(p.match_prefix(&segs("")).is_none());
        let root = PathPattern::parse("/").unwrap();
        assert_eq!(root.match_prefix(&segs("anything")).unwrap().consumed, 0);
    }

    #[test]
    fn parameters_match_one_segment_or_part_of_one() {
        let p = PathPattern::parse("/items/{id}/detail").unwrap();
        assert!(p.match_prefix(&segs("items/42/detail")).is_some());
        assert!(p.match_prefix(&segs("items/42")).is_none());
        assert!(p.match_prefix(&segs("items/4 2/detail")).is_none());
        let q = PathPattern::parse("item{id}.json").unwrap();
        assert!(q.match_prefix(&segs("item7.json")).is_some());
        assert!(q.match_prefix(&segs("item.json")).is_none());
        assert_eq!(
            p.match_prefix(&segs("items/1/detail")).unwrap().rank,
            (3, 2)
        );
    }

    #[test]
    fn bad_paths_are_refused() {
        for bad in ["/a//b", "/{}", "/{a b}", "/{a", "/{a}{b}"] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn targets_join_as_kubeedge_does() {
        assert_eq!(join("/api/", ""), "/api/");
        assert_eq!(join("/api/", "/x?y=1"), "/api/x?y=1");
        assert_eq!(join("/api", "x"), "/api/x");
        assert_eq!(join("t", "a/b"), "t/a/b");
    }
}
