//! Frame codec: one message per WebSocket frame, JSON text (protocol §2.2).

use crate::message::Message;

/// Default cap on one frame. KubeEdge has no explicit cap; a pod with large env or a secret
/// near the 1 MiB etcd object limit must still fit, with room for JSON escaping.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge { size: usize, limit: usize },
    #[error("empty frame")]
    Empty,
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
}

#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max_frame_bytes: usize,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

impl FrameCodec {
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameCodec { max_frame_bytes }
    }

    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Decodes a text or binary frame. Key order, whitespace, Go's `\u003c` escapes and the
    /// trailing newline gorilla's `WriteJSON` appends are all accepted.
    pub fn decode(&self, frame: &[u8]) -> Result<Message, CodecError> {
        if frame.len() > self.max_frame_bytes {
            return Err(CodecError::TooLarge {
                size: frame.len(),
                limit: self.max_frame_bytes,
            });
        }
        if frame.iter().all(u8::is_ascii_whitespace) {
            return Err(CodecError::Empty);
        }
        Ok(serde_json::from_slice(frame)?)
    }

    /// Encodes a message as the JSON text of one frame.
    pub fn encode(&self, msg: &Message) -> Result<String, CodecError> {
        let text = serde_json::to_string(msg)?;
        if text.len() > self.max_frame_bytes {
            return Err(CodecError::TooLarge {
                size: text.len(),
                limit: self.max_frame_bytes,
            });
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn oversized_frames_are_rejected_both_ways() {
        let codec = FrameCodec::new(64);
        let big = vec![b' '; 65];
        assert!(matches!(
            codec.decode(&big),
            Err(CodecError::TooLarge {
                size: 65,
                limit: 64
            })
        ));
        let msg = Message::keepalive();
        assert!(matches!(
            codec.encode(&msg),
            Err(CodecError::TooLarge { .. })
        ));
    }

    #[test]
    fn empty_and_garbage_frames_are_errors() {
        let codec = FrameCodec::default();
        assert!(matches!(codec.decode(b"\n"), Err(CodecError::Empty)));
        assert!(matches!(codec.decode(b"{"), Err(CodecError::Malformed(_))));
        assert!(matches!(codec.decode(b"{}"), Err(CodecError::Malformed(_))));
        assert!(matches!(
            codec.decode(b"[1,2]"),
            Err(CodecError::Malformed(_))
        ));
    }

    /// Found by fuzzing (`e2e/fuzz/regressions/beehive_frame`): without serde_json's exact float
    /// parsing, a number with more digits than an f64 holds came back one ULP off after a
    /// decode and an encode, so a relayed object changed value.
    #[test]
    fn numbers_keep_their_value_through_a_frame() {
        let codec = FrameCodec::default();
        for n in [
            "1700000022222222222222222222222222222222222222222222222222222222222222222222222222222222222222222222222222222222222200000",
            "0.30000000000000004441",
            "2.2250738585072011e-308",
            "9007199254740993",
        ] {
            let frame =
                format!(r#"{{"header":{{"msg_id":"1"}},"route":{{}},"content":{{"v":{n}}}}}"#);
            let msg = codec.decode(frame.as_bytes()).unwrap();
            let again = codec
                .decode(codec.encode(&msg).unwrap().as_bytes())
                .unwrap();
            assert_eq!(again, msg, "{n}");
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = FrameCodec::default().decode(&bytes);
        }

        #[test]
        fn encode_decode_round_trip(
            id in "[a-f0-9-]{1,36}",
            parent in "[a-f0-9-]{0,36}",
            ts in 0i64..i64::MAX / 2,
            rv in "[0-9]{0,10}",
            resource in "[a-z/]{0,30}",
            op in "[a-z]{0,10}",
            text in ".{0,40}",
        ) {
            let mut m = Message::new("edgecontroller", "resource".into(), op.as_str().into(), resource, serde_json::Value::String(text));
            m.header.id = id;
            m.header.parent_id = parent;
            m.header.timestamp = ts;
            m.header.resource_version = rv;
            let codec = FrameCodec::default();
            let text = codec.encode(&m).unwrap();
            prop_assert_eq!(codec.decode(text.as_bytes()).unwrap(), m.clone());
            let with_newline = format!("{text}\n");
            prop_assert_eq!(codec.decode(with_newline.as_bytes()).unwrap(), m);
        }
    }
}
