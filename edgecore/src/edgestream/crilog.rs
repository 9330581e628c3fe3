//! CRI container log files (`<RFC3339Nano> stdout|stderr F|P <msg>`) turned into what the
//! kubelet's `/containerLogs` returns: the messages, a full line (`F`) ending with a newline
//! and partial ones (`P`) joined to the next, optionally prefixed with their timestamp, and
//! limited by `tailLines`, `sinceSeconds`/`sinceTime` and `limitBytes`.

use kubeedge_shared::clock::parse_rfc3339;
use kubeedge_shared::stream::parse_query;
use std::time::{Duration, SystemTime};

/// The kubelet's log options from a `/containerLogs` query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
    /// Only lines at or after this instant.
    pub since: Option<SystemTime>,
}

fn truthy(v: &str) -> bool {
    matches!(v, "" | "1" | "t" | "T" | "true" | "TRUE" | "True")
}

impl LogOptions {
    pub fn from_query(raw: &str, now: SystemTime) -> Result<Self, String> {
        let mut o = LogOptions::default();
        for (k, v) in parse_query(raw) {
            let num = |what: &str| {
                v.parse::<i64>()
                    .map_err(|_| format!("invalid {what} {v:?}: must be an integer"))
            };
            match k.as_str() {
                "follow" => o.follow = truthy(&v),
                "previous" => o.previous = truthy(&v),
                "timestamps" => o.timestamps = truthy(&v),
                "tailLines" => {
                    let n = num("tailLines")?;
                    o.tail_lines = (n >= 0).then_some(n as usize);
                }
                "limitBytes" => {
                    let n = num("limitBytes")?;
                    if n < 1 {
                        return Err("limitBytes must be greater than zero".into());
                    }
                    o.limit_bytes = Some(n as usize);
                }
                "sinceSeconds" => {
                    let n = num("sinceSeconds")?;
                    if n < 1 {
                        return Err("sinceSeconds must be greater than zero".into());
                    }
                    o.since = now.checked_sub(Duration::from_secs(n as u64));
                }
                "sinceTime" => {
                    o.since =
                        Some(parse_rfc3339(&v).ok_or_else(|| format!("invalid sinceTime {v:?}"))?);
                }
                _ => {}
            }
        }
        Ok(o)
    }
}

/// One decoded log file line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine<'a> {
    pub timestamp: &'a str,
    pub stream: &'a str,
    pub partial: bool,
    pub message: &'a [u8],
}

/// Decodes one line of a CRI log file (without its trailing newline).
pub fn decode_line(line: &[u8]) -> Option<LogLine<'_>> {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let timestamp = std::str::from_utf8(fields.next()?).ok()?;
    let stream = std::str::from_utf8(fields.next()?).ok()?;
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    let tag = fields.next()?;
    let message = fields.next().unwrap_or_default();
    Some(LogLine {
        timestamp,
        stream,
        partial: tag.split(|b| *b == b':').any(|t| t == b"P"),
        message,
    })
}

/// Longest log-file line kept (the runtime splits lines at 16 KiB by default); a longer one
/// (a runtime without a line limit, a file that is not a CRI log) is skipped rather than
/// buffered without bound.
pub const MAX_LINE: usize = 1 << 20;

/// Turns log-file bytes into output, keeping state across chunks (a `follow` reader feeds
/// it what the file grows by).
pub struct Decoder {
    opts: LogOptions,
    /// Bytes of an incomplete last line.
    pending: Vec<u8>,
    /// Inside a line longer than [`MAX_LINE`]: skipping to its end.
    skipping: bool,
    /// Output bytes still allowed (`limitBytes`).
    budget: Option<usize>,
}

impl Decoder {
    pub fn new(opts: LogOptions) -> Self {
        Decoder {
            budget: opts.limit_bytes,
            opts,
            pending: Vec::new(),
            skipping: false,
        }
    }

    /// Whether `limitBytes` has been reached.
    pub fn exhausted(&self) -> bool {
        self.budget == Some(0)
    }

    /// Appends the output for the complete lines in `pending + chunk` to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<u8>) {
        if self.skipping {
            let Some(nl) = chunk.iter().position(|b| *b == b'\n') else {
                return;
            };
            chunk = &chunk[nl + 1..];
            self.skipping = false;
        }
        self.pending.extend_from_slice(chunk);
        let Some(last_nl) = self.pending.iter().rposition(|b| *b == b'\n') else {
            if self.pending.len() > MAX_LINE {
                tracing::debug!("container log line over {MAX_LINE} bytes skipped");
                self.pending = Vec::new();
                self.skipping = true;
            }
            return;
        };
        let rest = self.pending.split_off(last_nl + 1);
        let complete = std::mem::replace(&mut self.pending, rest);
        for line in complete.split(|b| *b == b'\n') {
            if line.is_empty() {
                continue;
            }
            self.line(line, out);
        }
    }

    fn line(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        if self.exhausted() {
            return;
        }
        let Some(l) = decode_line(raw) else {
            tracing::debug!("undecodable container log line skipped");
            return;
        };
        if let Some(since) = self.opts.since
            && parse_rfc3339(l.timestamp).is_some_and(|t| t < since)
        {
            return;
        }
        let start = out.len();
        if self.opts.timestamps {
            out.extend_from_slice(l.timestamp.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(l.message);
        if !l.partial {
            out.push(b'\n');
        }
        if let Some(budget) = self.budget.as_mut() {
            let produced = out.len() - start;
            if produced > *budget {
                out.truncate(start + *budget);
                *budget = 0;
            } else {
                *budget -= produced;
            }
        }
    }
}

/// Where in `content` the last `n` lines start (the kubelet's tail: file lines).
pub fn tail_start(content: &[u8], n: usize) -> usize {
    if n == 0 {
        return content.len();
    }
    let body = content.strip_suffix(b"\n").unwrap_or(content);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    const LOG: &[u8] = b"2024-05-01T12:00:00.000000001Z stdout F one\n\
2024-05-01T12:00:01.5Z stderr P tw\n\
2024-05-01T12:00:01.6Z stderr F o\n\
2024-05-01T12:00:02Z stdout F \xff binary\n\
garbage line\n\
2024-05-01T12:00:03+02:00 stdout F three\n";

    fn decode(opts: LogOptions, content: &[u8]) -> Vec<u8> {
        let mut d = Decoder::new(opts);
        let mut out = Vec::new();
        d.feed(content, &mut out);
        out
    }

    #[test]
    fn lines_decode_like_the_kubelet() {
        assert_eq!(
            decode(LogOptions::default(), LOG),
            b"one\ntwo\n\xff binary\nthree\n".to_vec()
        );
        let ts = decode(
            LogOptions {
                timestamps: true,
                ..Default::default()
            },
            &LOG[..LOG.iter().position(|b| *b == b'\n').unwrap() + 1],
        );
        assert_eq!(ts, b"2024-05-01T12:00:00.000000001Z one\n".to_vec());
        let l = decode_line(b"2024-05-01T12:00:00Z stdout P").unwrap();
        assert!(l.partial && l.message.is_empty());
        assert!(decode_line(b"2024 stdin F x").is_none());
    }

    #[test]
    fn chunks_split_anywhere_give_the_same_output() {
        let whole = decode(LogOptions::default(), LOG);
        for cut in 0..LOG.len() {
            let mut d = Decoder::new(LogOptions::default());
            let mut out = Vec::new();
            d.feed(&LOG[..cut], &mut out);
            d.feed(&LOG[cut..], &mut out);
            assert_eq!(out, whole, "cut at {cut}");
        }
    }

    #[test]
    fn an_endless_line_is_skipped_not_buffered() {
        let mut d = Decoder::new(LogOptions::default());
        let mut out = Vec::new();
        let junk = vec![b'x'; 64 * 1024];
        for _ in 0..(MAX_LINE / junk.len() + 2) {
            d.feed(&junk, &mut out);
            assert!(d.pending.len() <= MAX_LINE + junk.len());
        }
        d.feed(b"x\n2024-05-01T12:00:00Z stdout F next\n", &mut out);
        assert_eq!(out, b"next\n".to_vec());
    }

    #[test]
    fn tail_since_and_limit() {
        let start = tail_start(LOG, 2);
        assert_eq!(decode(LogOptions::default(), &LOG[start..]), b"three\n");
        assert_eq!(tail_start(LOG, 100), 0);
        assert_eq!(tail_start(LOG, 0), LOG.len());
        assert_eq!(tail_start(b"a\nb", 1), 2);
        let since = parse_rfc3339("2024-05-01T12:00:01.55Z").unwrap();
        let out = decode(
            LogOptions {
                since: Some(since),
                ..Default::default()
            },
            LOG,
        );
        // 12:00:03+02:00 is 10:00:03Z, before `since`.
        assert_eq!(out, b"o\n\xff binary\n".to_vec());
        let mut d = Decoder::new(LogOptions {
            limit_bytes: Some(5),
            ..Default::default()
        });
        let mut out = Vec::new();
        d.feed(LOG, &mut out);
        assert_eq!(out, b"one\nt".to_vec());
        assert!(d.exhausted());
    }

    #[test]
    fn query_options() {
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        let o = LogOptions::from_query(
            "follow=true&tailLines=3&timestamps=1&limitBytes=10&sinceSeconds=10&previous=false",
            now,
        )
        .unwrap();
        assert_eq!(
            o,
            LogOptions {
                follow: true,
                previous: false,
                timestamps: true,
                tail_lines: Some(3),
                limit_bytes: Some(10),
                since: Some(UNIX_EPOCH + Duration::from_secs(990)),
            }
        );
        assert!(LogOptions::from_query("tailLines=x", now).is_err());
        assert!(LogOptions::from_query("limitBytes=0", now).is_err());
        assert_eq!(
            LogOptions::from_query("tailLines=-1", now)
                .unwrap()
                .tail_lines,
            None
        );
    }
}
