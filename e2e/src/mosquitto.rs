//! A real mosquitto (the external broker of edgecore's eventbus) on a free loopback port, as a
//! child process of the test; killed on drop. Tests call [`Mosquitto::start_or_skip`], which
//! prints `SKIPPED` and returns `None` where mosquitto is not installed.

use crate::process::LoggedProcess;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const MOSQUITTO_BINARY: &str = "/usr/sbin/mosquitto";
/// How long mosquitto may take to accept connections.
const READY_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum MosquittoError {
    #[error(
        "{MOSQUITTO_BINARY} is missing: install package mosquitto with `sudo bash scripts/setup.sh`"
    )]
    Missing,
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("mosquitto did not accept connections on {addr} within {READY_DEADLINE:?}:\n{report}")]
    NotReady { addr: SocketAddr, report: String },
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> MosquittoError {
    let context = context.into();
    move |source| MosquittoError::Io { context, source }
}

/// A running mosquitto; see the module documentation.
pub struct Mosquitto {
    _dir: tempfile::TempDir,
    config: PathBuf,
    log_dir: PathBuf,
    addr: SocketAddr,
    process: Option<LoggedProcess>,
}

impl Mosquitto {
    pub fn installed() -> bool {
        Path::new(MOSQUITTO_BINARY).exists()
    }

    /// Starts mosquitto on a free port of 127.0.0.1 (anonymous clients allowed, no persistence)
    /// and waits until it accepts connections.
    pub fn start() -> Result<Mosquitto, MosquittoError> {
        if !Self::installed() {
            return Err(MosquittoError::Missing);
        }
        let dir = tempfile::Builder::new()
            .prefix("e2e-mosquitto-")
            .tempdir()
            .map_err(io_error("creating the mosquitto directory"))?;
        let mut m = Mosquitto {
            config: dir.path().join("mosquitto.conf"),
            log_dir: dir.path().to_path_buf(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            process: None,
            _dir: dir,
        };
        // Another process may take the free port before mosquitto binds it: try a few.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let port = free_port()?;
            m.addr.set_port(port);
            std::fs::write(
                &m.config,
                format!(
                    "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                     log_dest stderr\n"
                ),
            )
            .map_err(io_error("writing mosquitto.conf"))?;
            match m.run() {
                Ok(()) => return Ok(m),
                Err(MosquittoError::NotReady { .. }) if attempts < 3 => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Mosquitto::start`], or `None` after printing why `test` is skipped when mosquitto is not
    /// installed. Panics on any other failure.
    pub fn start_or_skip(test: &str) -> Option<Mosquitto> {
        match Mosquitto::start() {
            Ok(m) => Some(m),
            Err(MosquittoError::Missing) => {
                println!("SKIPPED {test}: {}", MosquittoError::Missing);
                None
            }
            Err(e) => panic!("starting mosquitto for {test}: {e}"),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The broker as edgecore's `mqttServerExternal` names it.
    pub fn url(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// Kills the broker (clients see the connection drop); [`Mosquitto::restart`] brings it back.
    pub fn stop(&mut self) {
        self.process = None;
    }

    /// Stops the broker if it runs and starts it again on the same port.
    pub fn restart(&mut self) -> Result<(), MosquittoError> {
        self.stop();
        self.run()
    }

    fn run(&mut self) -> Result<(), MosquittoError> {
        let mut command = Command::new(MOSQUITTO_BINARY);
        command.arg("-c").arg(&self.config);
        let mut process = LoggedProcess::spawn("mosquitto", command, &self.log_dir)
            .map_err(io_error(format!("starting {MOSQUITTO_BINARY}")))?;
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                self.process = Some(process);
                return Ok(());
            }
            if !process.is_running() || Instant::now() >= deadline {
                return Err(MosquittoError::NotReady {
                    addr: self.addr,
                    report: process.failure_report(20),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn free_port() -> Result<u16, MosquittoError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io_error("finding a free port"))?;
    Ok(l.local_addr()
        .map_err(io_error("finding a free port"))?
        .port())
}
