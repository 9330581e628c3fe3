//! `build-image`: container images without Docker, with the project's own deterministic image
//! builder (`e2e::images`, as the e2e harness builds busybox and pause).
//!
//! ```text
//! build-image cloudcore --binary target/release/cloudcore --out cloudcore-image.tar \
//!     [--tag kubeedge-rs/cloudcore:0.1.0] [--push localhost:5000/kubeedge-rs/cloudcore:0.1.0]
//! ```

use anyhow::Context;
use clap::{Parser, Subcommand};
use e2e::cloudcore_image::{self, CloudcoreImageSpec};
use e2e::images::{normalized_reference, registry_host, repository_and_tag};
use std::net::ToSocketAddrs;
use std::path::PathBuf;

/// Builds container images without Docker: an OCI image archive for `ctr images import` or
/// `skopeo copy oci-archive:…` (or, unpacked, `crane push <dir>`), and optionally pushes it to
/// a registry. The same inputs give the same digests.
#[derive(Parser)]
#[command(name = "build-image", version)]
struct Args {
    #[command(subcommand)]
    image: Image,
}

#[derive(Subcommand)]
enum Image {
    /// The cloudcore image: the binary at /usr/local/bin/cloudcore, its ELF loader and shared
    /// libraries (read from the binary's PT_INTERP/DT_NEEDED), /etc/passwd with user nonroot
    /// (65532, the image's user), OCI labels. No shell, no CA bundle, no iptables.
    Cloudcore(CloudcoreArgs),
}

#[derive(clap::Args)]
struct CloudcoreArgs {
    /// The cloudcore binary (cargo build --release -p cloudcore).
    #[arg(long, value_name = "FILE", default_value = "target/release/cloudcore")]
    binary: PathBuf,
    /// The image name written into the archive (containerd's name after `ctr images import`;
    /// a name without a registry is docker.io's, as containerd normalizes it).
    #[arg(long, value_name = "REF", default_value = concat!("kubeedge-rs/cloudcore:", env!("CARGO_PKG_VERSION")))]
    tag: String,
    /// Where to write the OCI image archive.
    #[arg(long, value_name = "FILE", default_value = "cloudcore-image.tar")]
    out: PathBuf,
    /// Also push to a registry over plain HTTP, e.g. localhost:5000/kubeedge-rs/cloudcore:0.1.0
    /// (no authentication; for HTTPS or credentials, copy the archive with skopeo or crane).
    #[arg(long, value_name = "HOST:PORT/REPO:TAG")]
    push: Option<String>,
    /// org.opencontainers.image.version (default: the workspace version).
    #[arg(long, value_name = "VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    version: String,
    /// More image labels, KEY=VALUE (repeatable), e.g.
    /// org.opencontainers.image.revision=$(git rev-parse HEAD).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn main() -> anyhow::Result<()> {
    let Args {
        image: Image::Cloudcore(args),
    } = Args::parse();
    let push_target = args.push.as_deref().map(push_target).transpose()?;
    let mut spec = CloudcoreImageSpec::new(&args.binary, &args.version);
    spec.extra_labels.extend(args.labels.iter().cloned());
    let built = cloudcore_image::build(&spec)?;
    let name = normalized_reference(&args.tag);
    built
        .image
        .write_archive_file(&args.out, &[&name])
        .context("writing the archive (is the --out directory writable?)")?;
    println!("image    {name}");
    println!("manifest {}", built.image.manifest.digest);
    println!("id       {}", built.image.id());
    for f in &built.runtime_files {
        println!("includes {}", f.image_path);
    }
    println!("archive  {}", args.out.display());
    if let Some((host, addr, repository, tag)) = push_target {
        e2e::registry::push(addr, &built.image, &repository, &tag).with_context(|| {
            format!(
                "pushing to http://{host} (a registry over HTTPS or with authentication: \
                 skopeo copy oci-archive:{} docker://{host}/{repository}:{tag})",
                args.out.display()
            )
        })?;
        println!("pushed   {host}/{repository}:{tag}");
    }
    Ok(())
}

/// `host:port/repo:tag` → (host, its address, repo, tag).
fn push_target(reference: &str) -> anyhow::Result<(String, std::net::SocketAddr, String, String)> {
    let host = registry_host(reference).with_context(|| {
        format!("--push {reference:?} names no registry: give HOST:PORT/REPOSITORY:TAG, e.g. localhost:5000/kubeedge-rs/cloudcore:0.1.0")
    })?;
    let (repository, tag) = repository_and_tag(reference);
    let with_port = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    let addr = with_port
        .to_socket_addrs()
        .with_context(|| format!("resolving the registry {host}"))?
        .next()
        .with_context(|| format!("{host} resolves to no address"))?;
    Ok((
        host.to_string(),
        addr,
        repository.to_string(),
        tag.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_targets_need_a_registry_host() {
        let (host, addr, repository, tag) =
            push_target("127.0.0.1:5000/kubeedge-rs/cloudcore:0.1.0").unwrap();
        assert_eq!(host, "127.0.0.1:5000");
        assert_eq!(addr.port(), 5000);
        assert_eq!(
            (repository.as_str(), tag.as_str()),
            ("kubeedge-rs/cloudcore", "0.1.0")
        );
        let (_, addr, _, tag) = push_target("localhost/cloudcore").unwrap();
        assert_eq!((addr.port(), tag.as_str()), (80, "latest"));
        let e = push_target("kubeedge-rs/cloudcore:0.1.0").unwrap_err();
        assert!(e.to_string().contains("names no registry"), "{e}");
    }

    #[test]
    fn labels_are_key_value() {
        assert_eq!(
            parse_label("org.opencontainers.image.revision=a=b").unwrap(),
            ("org.opencontainers.image.revision".into(), "a=b".into())
        );
        assert!(parse_label("novalue").is_err());
        assert!(parse_label("=x").is_err());
    }
}
