//! Entry points of cloudcore's fuzz targets (`e2e/fuzz`; see `kubeedge_shared::fuzz_targets`):
//! the join server's certificate requests and the configuration file.

use crate::config::CloudCoreConfig;
use crate::join::server::{JoinServer, authorize, sign};
use kubeedge_shared::fuzz_targets::{parts, text};
use kubeedge_shared::pki::CertificateAuthority;
use kubeedge_shared::token;
use std::sync::{Arc, OnceLock};

const NOW: i64 = 1_700_000_000;

fn join_server() -> &'static JoinServer {
    static SERVER: OnceLock<JoinServer> = OnceLock::new();
    SERVER.get_or_init(|| JoinServer {
        ca: Arc::new(CertificateAuthority::generate().expect("a CA")),
        signing_days: 365,
        allow_legacy_certificates: false,
        metrics: Default::default(),
    })
}

/// `GET /edge.crt` as an edge sends it: `NodeName`, `Authorization` and `ExtKeyUsages`
/// headers and the CSR body. A fuzzed `Authorization` of `valid` is replaced by a token the
/// CA signed, so that the CSR is read.
pub fn join_request(data: &[u8]) {
    let server = join_server();
    let p = parts(data, 4);
    let mut headers = http::HeaderMap::new();
    let mut set = |name: &'static str, value: &[u8]| {
        if let Ok(v) = http::HeaderValue::from_bytes(value) {
            headers.insert(name, v);
        }
    };
    set("NodeName", p[0]);
    let auth = p.get(1).copied().unwrap_or_default();
    if auth == b"valid" {
        let jwt = token::sign_jwt(&server.ca.key_der, NOW + 3600);
        set("Authorization", format!("Bearer {jwt}").as_bytes());
    } else {
        set("Authorization", auth);
    }
    if let Some(ekus) = p.get(2).filter(|e| !e.is_empty()) {
        set("ExtKeyUsages", ekus);
    }
    let body = p.get(3).copied().unwrap_or_default();
    if let Ok((node, ekus)) = authorize(server, &headers, None, NOW) {
        let _ = sign(server, &node, &ekus, body);
    }
    let _ = kubeedge_shared::pki::csr_subject(body);
    let _ = kubeedge_shared::pki::inspect_csr_pem(&text(body));
    let _ = kubeedge_shared::pki::cert_validity(body);
    let _ = kubeedge_shared::pki::cert_ip_sans(body);
}

/// `cloudcore.yaml`: parsed over the defaults, validated, written back.
pub fn cloud_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = CloudCoreConfig::from_yaml(text) {
        let _ = CloudCoreConfig::from_yaml(&config.to_yaml());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::fuzz_targets::replay;

    #[test]
    fn join_request_corpus_replays() {
        replay("join_request", join_request);
    }

    #[test]
    fn cloud_config_corpus_replays() {
        replay("cloud_config", cloud_config);
    }
}
