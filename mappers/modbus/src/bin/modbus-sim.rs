//! `modbus-sim`: a small Modbus TCP device for demos and tests — 16 holding registers, all
//! writable; register 0 is a "temperature" that moves between 20 and 29 every 2 s unless a
//! client wrote it. Prints `listening on <addr>` once it accepts connections.

use clap::Parser;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio_modbus::{ExceptionCode, Request, Response};

/// A simulated Modbus TCP device (16 holding registers; register 0 drifts like a thermometer).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:5020")]
    listen: SocketAddr,
}

const REGISTERS: u16 = 16;

#[derive(Clone, Default)]
struct Device {
    holding: Arc<Mutex<HashMap<u16, u16>>>,
    written: Arc<Mutex<bool>>,
}

impl Device {
    fn read(&self, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        if count == 0 || u32::from(addr) + u32::from(count) > u32::from(REGISTERS) {
            return Err(ExceptionCode::IllegalDataAddress);
        }
        let holding = self.holding.lock().unwrap_or_else(|e| e.into_inner());
        Ok((addr..addr + count)
            .map(|a| holding.get(&a).copied().unwrap_or(0))
            .collect())
    }

    fn write(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        if words.is_empty() || u32::from(addr) + words.len() as u32 > u32::from(REGISTERS) {
            return Err(ExceptionCode::IllegalDataAddress);
        }
        let mut holding = self.holding.lock().unwrap_or_else(|e| e.into_inner());
        for (i, w) in words.iter().enumerate() {
            holding.insert(addr + i as u16, *w);
        }
        if addr == 0 {
            *self.written.lock().unwrap_or_else(|e| e.into_inner()) = true;
        }
        tracing::info!(register = addr, ?words, "written");
        Ok(())
    }
}

impl tokio_modbus::server::Service for Device {
    type Request = Request<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = std::future::Ready<Result<Response, ExceptionCode>>;

    fn call(&self, request: Request<'static>) -> Self::Future {
        std::future::ready(match request {
            Request::ReadHoldingRegisters(a, n) => {
                self.read(a, n).map(Response::ReadHoldingRegisters)
            }
            Request::ReadInputRegisters(a, n) => self.read(a, n).map(Response::ReadInputRegisters),
            Request::WriteSingleRegister(a, w) => self
                .write(a, &[w])
                .map(|_| Response::WriteSingleRegister(a, w)),
            Request::WriteMultipleRegisters(a, ws) => {
                let n = ws.len() as u16;
                self.write(a, &ws)
                    .map(|_| Response::WriteMultipleRegisters(a, n))
            }
            _ => Err(ExceptionCode::IllegalFunction),
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr()?;
    let device = Device::default();
    let drift = device.clone();
    tokio::spawn(async move {
        let mut t = 0u16;
        loop {
            if !*drift.written.lock().unwrap_or_else(|e| e.into_inner()) {
                drift
                    .holding
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(0, 20 + t % 10);
            }
            t = t.wrapping_add(1);
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
    });
    println!("listening on {addr}");
    let server = tokio_modbus::server::tcp::Server::new(listener);
    let on_connected = |stream, _peer| {
        let device = device.clone();
        async move { Ok(Some((device, stream))) }
    };
    tokio::select! {
        r = server.serve(&on_connected, |e| tracing::warn!(error = %e, "connection failed")) => {
            r.map_err(|e| anyhow::anyhow!("server stopped: {e}"))?;
        }
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
