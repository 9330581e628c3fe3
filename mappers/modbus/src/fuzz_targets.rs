//! Entry points of the Modbus mapper's fuzz targets (`e2e/fuzz`; see
//! `kubeedge_shared::fuzz_targets`): a device's answer to a register read, and the DMI device
//! edgecore hands the mapper.

use crate::config::device_config;
use crate::modbus::{self, RegisterKind, Visitor};
use kubeedge_dmi::v1beta1 as pb;
use prost::Message as _;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A device that answers every request with the same bytes, then hangs up.
#[derive(Debug)]
struct Device {
    answer: Vec<u8>,
    at: usize,
}

impl AsyncRead for Device {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = buf.remaining().min(self.answer.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.answer[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Device {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

/// A Modbus TCP answer to the mapper's read (two bytes pick the register kind, the count and
/// a scale; the rest is what the device sends), and the rest as a desired value to write.
pub fn modbus_response(data: &[u8]) {
    let [kind, limit, answer @ ..] = data else {
        return;
    };
    let visitor = Visitor {
        kind: match kind % 4 {
            0 => RegisterKind::Coil,
            1 => RegisterKind::DiscreteInput,
            2 => RegisterKind::Holding,
            _ => RegisterKind::Input,
        },
        offset: 0,
        limit: u16::from(*limit % 10).max(1),
        scale: (kind & 0x10 != 0).then_some(0.1),
    };
    let value = runtime().block_on(async {
        let transport = Device {
            answer: answer.to_vec(),
            at: 0,
        };
        let mut ctx = tokio_modbus::client::tcp::attach(transport);
        modbus::read(&mut ctx, &visitor).await
    });
    if let Ok(v) = value {
        assert!(v.len() <= modbus::MAX_VALUE_LEN);
    }
    let text = String::from_utf8_lossy(answer);
    let _ = modbus::parse_bits(&text, visitor.limit);
    let _ = modbus::parse_words(&text, visitor.limit, visitor.scale);
}

/// `RegisterDevice` from edgecore, turned into the device's Modbus settings.
pub fn modbus_device(data: &[u8]) {
    let Ok(request) = pb::RegisterDeviceRequest::decode(data) else {
        return;
    };
    if let Some(device) = &request.device {
        let _ = device_config(device, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::fuzz_targets::replay;

    #[test]
    fn modbus_response_corpus_replays() {
        replay("modbus_response", modbus_response);
    }

    /// Found by fuzzing (`e2e/fuzz/regressions/modbus_response`): tokio-modbus only
    /// debug-asserts the number of registers in an answer, so this panicked the mapper.
    #[test]
    fn a_device_answering_fewer_registers_than_asked_is_a_property_error() {
        // MBAP (transaction 0, length 7, unit 0xff), function 3, 4 bytes: two registers.
        let answer = vec![0, 0, 0, 0, 0, 7, 0xff, 3, 4, 0, 1, 0, 2];
        let visitor = Visitor {
            kind: RegisterKind::Holding,
            offset: 0,
            limit: 6,
            scale: None,
        };
        let read = runtime().block_on(async {
            let mut ctx = tokio_modbus::client::tcp::attach(Device { answer, at: 0 });
            modbus::read(&mut ctx, &visitor).await
        });
        assert!(matches!(read, Err(modbus::IoError::Answer(_))), "{read:?}");
    }

    #[test]
    fn modbus_device_corpus_replays() {
        replay("modbus_device", modbus_device);
    }
}
