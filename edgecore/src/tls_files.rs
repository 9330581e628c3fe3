//! The edge's TLS material as the config names it: each file loaded with an error that names
//! its config field and what to do, and the client configuration edgehub dials with.

use crate::config::EdgeCoreConfig;
use kubeedge_shared::tls::{self, TlsError};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error(
        "cannot load {field} ({path}): {source}\n  \
         This edge has no usable certificate yet: set modules.edgeHub.token (from \
         `keadm gettoken`) and modules.edgeHub.httpServer to obtain one, run `edgecore join`, \
         or point {field} in the config at the right file."
    )]
    File {
        field: &'static str,
        path: String,
        source: TlsError,
    },
    #[error(
        "TLS setup with {cert} / {key}: {source}\n  \
         Check that modules.edgeHub.tlsCertFile and tlsPrivateKeyFile belong together and \
         that tlsCaFile is the cloud's CA."
    )]
    Pair {
        cert: String,
        key: String,
        source: TlsError,
    },
}

/// The error for a TLS file of config `field` that could not be loaded.
pub(crate) fn load_err(field: &'static str, path: &str) -> impl FnOnce(TlsError) -> TlsFileError {
    let path = path.to_string();
    move |source| TlsFileError::File {
        field,
        path,
        source,
    }
}

/// Loads the client TLS configuration from the files `modules.edgeHub` names.
pub fn load_tls(config: &EdgeCoreConfig) -> Result<Arc<rustls::ClientConfig>, TlsFileError> {
    let hub = &config.modules.edge_hub;
    let ca = tls::load_certs(Path::new(&hub.tls_ca_file))
        .map_err(load_err("modules.edgeHub.tlsCaFile", &hub.tls_ca_file))?;
    let chain = tls::load_certs(Path::new(&hub.tls_cert_file))
        .map_err(load_err("modules.edgeHub.tlsCertFile", &hub.tls_cert_file))?;
    let key = tls::load_key(Path::new(&hub.tls_private_key_file)).map_err(load_err(
        "modules.edgeHub.tlsPrivateKeyFile",
        &hub.tls_private_key_file,
    ))?;
    tls::client_config(&ca, chain, key).map_err(|source| TlsFileError::Pair {
        cert: hub.tls_cert_file.clone(),
        key: hub.tls_private_key_file.clone(),
        source,
    })
}
