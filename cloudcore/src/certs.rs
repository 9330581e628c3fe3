//! The CA and the cloudhub server certificate (protocol §6.1).
//!
//! CA: from `tlsCAFile`/`tlsCAKeyFile` when both exist, else the Secret `kubeedge/casecret`
//! (`cadata`, `cakeydata`), else generated and stored there. Creation is race-safe across
//! replicas: whoever loses the create (409) reads the winner's CA. The server certificate is
//! taken from `tlsCertFile`/`tlsPrivateKeyFile` when both exist, else issued at start by the CA
//! for `advertiseAddress` + `dnsNames`, so every replica's certificate names the addresses
//! edges dial and chains to the one CA.

use crate::config::CloudHubConfig;
use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kubeedge_shared::pki::CertificateAuthority;
use kubeedge_shared::tls;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;

pub use kubeedge_shared::constants::CLOUDCORE_NAMESPACE as NAMESPACE;
pub const CA_SECRET: &str = "casecret";

pub struct HubCerts {
    pub ca: CertificateAuthority,
    pub server_chain: Vec<CertificateDer<'static>>,
    pub server_key: PrivateKeyDer<'static>,
}

impl HubCerts {
    pub fn server_tls(&self) -> anyhow::Result<std::sync::Arc<rustls::ServerConfig>> {
        Ok(tls::server_config(
            self.server_chain.clone(),
            self.server_key.clone_key(),
            std::slice::from_ref(&self.ca.cert.cert_der),
            true,
        )?)
    }
}

pub async fn prepare(
    client: Option<&kube::Client>,
    hub: &CloudHubConfig,
) -> anyhow::Result<HubCerts> {
    let ca = load_ca(client, hub).await?;
    let (cert, key) = (
        Path::new(&hub.tls_cert_file),
        Path::new(&hub.tls_private_key_file),
    );
    if cert.exists() && key.exists() {
        tracing::info!(cert = %cert.display(), "using the server certificate from files");
        return Ok(HubCerts {
            ca,
            server_chain: tls::load_certs(cert)?,
            server_key: tls::load_key(key)?,
        });
    }
    let mut sans: Vec<&str> = hub.advertise_address.iter().map(String::as_str).collect();
    sans.extend(hub.dns_names.iter().map(String::as_str));
    let issued = ca
        .issue_server(&sans, 36_500)
        .context("issuing the cloudhub server certificate")?;
    tracing::info!(?sans, "issued the cloudhub server certificate");
    Ok(HubCerts {
        server_chain: vec![issued.cert_der.clone()],
        server_key: issued.key_der(),
        ca,
    })
}

async fn load_ca(
    client: Option<&kube::Client>,
    hub: &CloudHubConfig,
) -> anyhow::Result<CertificateAuthority> {
    let (cert, key) = (Path::new(&hub.tls_ca_file), Path::new(&hub.tls_ca_key_file));
    if cert.exists() && key.exists() {
        let c =
            std::fs::read_to_string(cert).with_context(|| format!("reading {}", cert.display()))?;
        let k =
            std::fs::read_to_string(key).with_context(|| format!("reading {}", key.display()))?;
        tracing::info!(ca = %cert.display(), "using the CA from files");
        return CertificateAuthority::from_pem(&c, &k).with_context(|| {
            format!(
                "loading the CA from {} and {}",
                cert.display(),
                key.display()
            )
        });
    }
    let Some(client) = client else {
        anyhow::bail!(
            "no CA: {} / {} do not exist and there is no Kubernetes API to keep one in",
            cert.display(),
            key.display()
        );
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    if let Some(existing) = secrets
        .get_opt(CA_SECRET)
        .await
        .context("reading Secret kubeedge/casecret")?
    {
        tracing::info!("using the CA from Secret kubeedge/casecret");
        return ca_from_secret(&existing);
    }
    let ca = CertificateAuthority::generate()?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            namespace: Some(NAMESPACE.into()),
            ..Default::default()
        },
        data: Some(
            [
                ("cadata".to_string(), ByteString(ca.cert.cert_der.to_vec())),
                // SEC1, as KubeEdge writes it (join tokens are HMACed with these bytes).
                ("cakeydata".to_string(), ByteString(ca.key_der.clone())),
            ]
            .into(),
        ),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!("generated a new CA and stored it in Secret kubeedge/casecret");
            Ok(ca)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::info!("another replica created the CA first; using it");
            ca_from_secret(&secrets.get(CA_SECRET).await?)
        }
        Err(e) => Err(e).context("creating Secret kubeedge/casecret (does namespace kubeedge exist and may cloudcore create secrets there?)"),
    }
}

fn ca_from_secret(s: &Secret) -> anyhow::Result<CertificateAuthority> {
    let data = s
        .data
        .as_ref()
        .context("Secret kubeedge/casecret has no data")?;
    let cert = data
        .get("cadata")
        .context("Secret kubeedge/casecret lacks cadata")?;
    let key = data
        .get("cakeydata")
        .context("Secret kubeedge/casecret lacks cakeydata")?;
    CertificateAuthority::from_der(&cert.0, &key.0)
        .context("Secret kubeedge/casecret holds an unusable CA")
}
