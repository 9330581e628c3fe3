//! Just enough RFC 6455 for the stream tunnel, over any async byte stream: KubeEdge sends
//! binary tunnel messages in TEXT frames, which WebSocket libraries reject as invalid UTF-8, so
//! the tunnel reads and writes frames itself. Fragmented messages are reassembled (gorilla
//! splits messages larger than its write buffer), control frames are handed out as they come.

use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};

pub const OP_CONTINUATION: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// One complete message or control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsEvent {
    /// A TEXT or BINARY message (payload as received, never UTF-8 checked).
    Data {
        opcode: u8,
        payload: Vec<u8>,
    },
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads frames; `max_message` bounds a reassembled message.
pub struct WsReader<R> {
    inner: R,
    max_message: usize,
    partial: Option<(u8, Vec<u8>)>,
}

impl<R: AsyncRead + Unpin> WsReader<R> {
    pub fn new(inner: R, max_message: usize) -> Self {
        WsReader {
            inner,
            max_message,
            partial: None,
        }
    }

    /// The next message or control frame; `None` when the stream ended.
    pub async fn next(&mut self) -> io::Result<Option<WsEvent>> {
        loop {
            let mut head = [0u8; 2];
            match self.inner.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e),
            }
            let fin = head[0] & 0x80 != 0;
            if head[0] & 0x70 != 0 {
                return Err(invalid("WebSocket frame with reserved bits set".into()));
            }
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let len = match head[1] & 0x7f {
                126 => u64::from(self.inner.read_u16().await?),
                127 => self.inner.read_u64().await?,
                n => u64::from(n),
            };
            let so_far = self.partial.as_ref().map_or(0, |p| p.1.len());
            let len = usize::try_from(len)
                .ok()
                .filter(|l| l.saturating_add(so_far) <= self.max_message)
                .ok_or_else(|| {
                    invalid(format!(
                        "WebSocket message of more than {} bytes (frame of {len})",
                        self.max_message
                    ))
                })?;
            let mut key = [0u8; 4];
            if masked {
                self.inner.read_exact(&mut key).await?;
            }
            let mut payload = vec![0u8; len];
            self.inner.read_exact(&mut payload).await?;
            if masked {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= key[i % 4];
                }
            }
            match opcode {
                OP_PING => return Ok(Some(WsEvent::Ping(payload))),
                OP_PONG => return Ok(Some(WsEvent::Pong(payload))),
                OP_CLOSE => return Ok(Some(WsEvent::Close)),
                OP_TEXT | OP_BINARY => {
                    if self.partial.is_some() {
                        return Err(invalid(
                            "new WebSocket message inside a fragmented one".into(),
                        ));
                    }
                    if fin {
                        return Ok(Some(WsEvent::Data { opcode, payload }));
                    }
                    self.partial = Some((opcode, payload));
                }
                OP_CONTINUATION => {
                    let Some((op, mut buf)) = self.partial.take() else {
                        return Err(invalid("WebSocket continuation without a message".into()));
                    };
                    buf.extend_from_slice(&payload);
                    if fin {
                        return Ok(Some(WsEvent::Data {
                            opcode: op,
                            payload: buf,
                        }));
                    }
                    self.partial = Some((op, buf));
                }
                other => return Err(invalid(format!("unknown WebSocket opcode {other:#x}"))),
            }
        }
    }
}

/// One whole frame (FIN set); `mask` is required from clients.
pub fn encode_frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(0x80 | opcode);
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    out
}

/// Writes whole frames; masks them when it is the client side.
pub struct WsWriter<W> {
    inner: W,
    client: bool,
}

impl<W: AsyncWrite + Unpin> WsWriter<W> {
    pub fn new(inner: W, client: bool) -> Self {
        WsWriter { inner, client }
    }

    pub async fn send(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        let mask = self.client.then(rand::random::<[u8; 4]>);
        self.inner
            .write_all(&encode_frame(opcode, payload, mask))
            .await?;
        self.inner.flush().await
    }

    pub async fn shutdown(&mut self) {
        let _ = self.inner.shutdown().await;
    }
}

/// The `Sec-WebSocket-Accept` value for a request's `Sec-WebSocket-Key`.
pub fn accept_key(request_key: &[u8]) -> String {
    derive_accept_key(request_key)
}

/// Client side of the opening handshake: sends `GET path` with `headers` and checks the 101
/// answer. Reads the answer byte by byte so nothing after it is consumed.
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> io::Result<()> {
    let key = generate_key();
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await?;
    stream.flush().await?;
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            return Err(invalid("WebSocket handshake answer too long".into()));
        }
        let b = stream.read_u8().await?;
        head.push(b);
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let status = lines.next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("101") {
        return Err(invalid(format!(
            "WebSocket handshake refused: {}",
            status.trim()
        )));
    }
    let expected = derive_accept_key(key.as_bytes());
    let accepted = lines.filter_map(|l| l.split_once(':')).any(|(k, v)| {
        k.trim().eq_ignore_ascii_case("sec-websocket-accept") && v.trim() == expected
    });
    if !accepted {
        return Err(invalid(
            "WebSocket handshake: wrong Sec-WebSocket-Accept".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn text_frames_carry_non_utf8_and_fragments_reassemble() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let (_ar, aw) = tokio::io::split(a);
        let (br, _bw) = tokio::io::split(b);
        let mut w = WsWriter::new(aw, true);
        let mut r = WsReader::new(br, 1 << 20);
        w.send(OP_TEXT, &[0xff, 0x00, 0xfe]).await.unwrap();
        w.send(OP_PING, b"ping you").await.unwrap();
        let big = vec![0xc3u8; 70_000];
        w.send(OP_TEXT, &big).await.unwrap();
        assert_eq!(
            r.next().await.unwrap(),
            Some(WsEvent::Data {
                opcode: OP_TEXT,
                payload: vec![0xff, 0x00, 0xfe]
            })
        );
        assert_eq!(
            r.next().await.unwrap(),
            Some(WsEvent::Ping(b"ping you".to_vec()))
        );
        assert_eq!(
            r.next().await.unwrap(),
            Some(WsEvent::Data {
                opcode: OP_TEXT,
                payload: big
            })
        );
        // A message fragmented the way gorilla does, with a ping in between.
        let mut raw = vec![OP_TEXT, 2, 0x80, 0x81];
        raw.extend(encode_frame(OP_PING, b"p", None));
        raw.extend([0x80, 1, 0xff]);
        let mut r = WsReader::new(&raw[..], 1 << 20);
        assert_eq!(r.next().await.unwrap(), Some(WsEvent::Ping(b"p".to_vec())));
        assert_eq!(
            r.next().await.unwrap(),
            Some(WsEvent::Data {
                opcode: OP_TEXT,
                payload: vec![0x80, 0x81, 0xff]
            })
        );
        assert_eq!(r.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn oversized_and_malformed_frames_are_errors() {
        let frame = encode_frame(OP_TEXT, &[1u8; 100], None);
        let mut r = WsReader::new(&frame[..], 50);
        assert!(r.next().await.is_err());
        let mut r = WsReader::new(&[0x80u8, 1, 0][..], 50);
        assert!(r.next().await.is_err(), "continuation without start");
        let mut r = WsReader::new(&[0x83u8, 0][..], 50);
        assert!(r.next().await.is_err(), "unknown opcode");
    }
}
