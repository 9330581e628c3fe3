//! Client of the Kubernetes Container Runtime Interface (CRI v1) over a unix socket.
//!
//! The gRPC code is generated at build time from the vendored `proto/api.proto`
//! (k8s.io/cri-api `pkg/apis/runtime/v1`), see `build.rs`. [`CriClient`] dials the runtime's
//! socket (containerd: `unix:///run/containerd/containerd.sock`) and hands out the two service
//! clients; they share one HTTP/2 connection and are cheap to clone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Types and service clients/servers generated from the CRI v1 protobuf (`package runtime.v1`).
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    rustdoc::bare_urls,
    rustdoc::invalid_html_tags,
    rustdoc::broken_intra_doc_links
)]
pub mod api {
    tonic::include_proto!("runtime.v1");
}

pub mod runtime;

pub use api::image_service_client::ImageServiceClient;
pub use api::runtime_service_client::RuntimeServiceClient;

/// Where edgecore finds containerd unless configured otherwise (KubeEdge's default).
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The CRI API version string sent in `VersionRequest` (what the kubelet sends).
pub const API_VERSION: &str = "v1";

/// Largest message accepted from the runtime; the kubelet uses the same 16 MiB cap so that
/// `ListContainers` on a busy node fits.
pub const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors from setting up a [`CriClient`]. Failed calls return [`tonic::Status`].
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("invalid CRI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        endpoint: String,
        reason: &'static str,
    },
    #[error("cannot connect to the CRI runtime at {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
}

/// A connection to a CRI runtime (containerd, CRI-O, or a fake in tests).
#[derive(Clone, Debug)]
pub struct CriClient {
    channel: Channel,
    socket: PathBuf,
}

impl CriClient {
    /// Dials the runtime now; fails if its socket does not accept connections.
    ///
    /// `endpoint` is `unix:///path/to.sock` (as in `--container-runtime-endpoint`) or a plain
    /// absolute path.
    pub async fn connect(endpoint: &str) -> Result<Self, CriError> {
        let socket = socket_path(endpoint)?;
        let channel =
            unix_endpoint(&socket)?
                .connect()
                .await
                .map_err(|source| CriError::Connect {
                    socket: socket.clone(),
                    source,
                })?;
        Ok(Self { channel, socket })
    }

    /// Like [`CriClient::connect`] but dials on first use (and again after the runtime
    /// restarts), so an agent can start before its runtime does.
    pub fn connect_lazy(endpoint: &str) -> Result<Self, CriError> {
        let socket = socket_path(endpoint)?;
        let channel = unix_endpoint(&socket)?.connect_lazy();
        Ok(Self { channel, socket })
    }

    /// The runtime's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `runtime.v1.RuntimeService`: sandboxes, containers, exec, stats, status.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    /// `runtime.v1.ImageService`: pull, list, inspect and remove images.
    pub fn image(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    /// The runtime's name and versions (`RuntimeService.Version`).
    pub async fn version(&self) -> Result<api::VersionResponse, tonic::Status> {
        let request = api::VersionRequest {
            version: API_VERSION.to_string(),
        };
        Ok(self.runtime().version(request).await?.into_inner())
    }
}

/// The socket path named by a CRI endpoint: `unix:///run/x.sock`, `unix:/run/x.sock` or
/// `/run/x.sock`. Other schemes (`tcp://`, `npipe://`) are not supported.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let invalid = |reason| CriError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let path = match endpoint.split_once("://") {
        Some(("unix", path)) => path,
        Some(_) => return Err(invalid("only unix:// endpoints are supported")),
        None => endpoint.strip_prefix("unix:").unwrap_or(endpoint),
    };
    if path.is_empty() {
        return Err(invalid("the socket path is empty"));
    }
    if !path.starts_with('/') {
        return Err(invalid("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

fn unix_endpoint(socket: &Path) -> Result<Endpoint, CriError> {
    let uri = format!("unix://{}", socket.display());
    let endpoint = Endpoint::from_shared(uri).map_err(|_| CriError::InvalidEndpoint {
        endpoint: socket.display().to_string(),
        reason: "not a valid URI",
    })?;
    Ok(endpoint.connect_timeout(CONNECT_TIMEOUT))
}

#[cfg(test)]
pub(crate) mod fake;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms_name_the_same_socket() {
        let expected = PathBuf::from("/run/containerd/containerd.sock");
        for endpoint in [
            "unix:///run/containerd/containerd.sock",
            "unix:/run/containerd/containerd.sock",
            "/run/containerd/containerd.sock",
        ] {
            assert_eq!(socket_path(endpoint).unwrap(), expected, "{endpoint}");
        }
    }

    #[test]
    fn non_unix_or_relative_endpoints_are_rejected() {
        for endpoint in [
            "tcp://127.0.0.1:1234",
            "npipe:////./pipe/x",
            "unix://",
            "run/x.sock",
            "",
        ] {
            assert!(
                matches!(socket_path(endpoint), Err(CriError::InvalidEndpoint { .. })),
                "{endpoint}"
            );
        }
    }

    #[tokio::test]
    async fn connecting_to_a_missing_socket_names_the_socket() {
        let dir = std::env::temp_dir().join(format!("cri-missing-{}", std::process::id()));
        let endpoint = format!("unix://{}/none.sock", dir.display());
        let err = CriClient::connect(&endpoint).await.unwrap_err();
        assert!(matches!(err, CriError::Connect { .. }), "{err:?}");
        assert!(err.to_string().contains("none.sock"), "{err}");
    }

    /// A fake runtime: the generated server with default stubs answers UNIMPLEMENTED for
    /// every RPC it does not override. The pattern for testing edged without containerd.
    struct FakeRuntime;

    #[tonic::async_trait]
    impl api::runtime_service_server::RuntimeService for FakeRuntime {
        async fn version(
            &self,
            request: tonic::Request<api::VersionRequest>,
        ) -> Result<tonic::Response<api::VersionResponse>, tonic::Status> {
            Ok(tonic::Response::new(api::VersionResponse {
                version: request.into_inner().version,
                runtime_name: "fake".into(),
                runtime_version: "0.0.1".into(),
                runtime_api_version: "v1".into(),
            }))
        }
    }

    #[tokio::test]
    async fn client_talks_to_a_fake_runtime_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        // Without tonic's `router` feature a server serves one service; the generated
        // server answers UNIMPLEMENTED for paths it does not know.
        let server = tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
            api::runtime_service_server::RuntimeServiceServer::new(FakeRuntime),
            tokio_stream::wrappers::UnixListenerStream::new(listener),
        ));

        let client = CriClient::connect(&format!("unix://{}", socket.display()))
            .await
            .unwrap();
        assert_eq!(client.socket(), socket);
        let version = client.version().await.unwrap();
        assert_eq!(version.version, API_VERSION);
        assert_eq!(version.runtime_name, "fake");

        let status = client
            .runtime()
            .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
        // The image service is not served at all.
        let status = client
            .image()
            .list_images(api::ListImagesRequest { filter: None })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
        server.abort();
    }

    #[tokio::test]
    async fn lazy_client_reports_unavailable_when_nothing_listens() {
        let client = CriClient::connect_lazy("/nonexistent/kubeedge-rs/cri.sock").unwrap();
        let status = client.version().await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
}
