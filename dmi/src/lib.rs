//! KubeEdge DMI v1beta1: the gRPC interface between edgecore (`DeviceManagerService`, served on
//! `/etc/kubeedge/dmi.sock`) and device mappers (`DeviceMapperService`, served on the socket each
//! mapper announces when it registers).
//!
//! - [`v1beta1`]: the generated messages, clients and servers of both services.
//! - [`any_from_json`] / [`json_from_any`]: the `google.protobuf.Any` encoding of `configData`.
//! - [`device_from_crd`] / [`model_from_crd`]: a v1beta1 Device / DeviceModel object (JSON) to
//!   the DMI message edgecore sends; [`device_with_model_defaults`]: v1.23's model defaults.
//! - [`serve_uds`] / [`bind_uds`] / [`serve_listener`] / [`connect_uds`] / [`connect_uds_lazy`]:
//!   plaintext gRPC over unix sockets.

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    rustdoc::bare_urls,
    rustdoc::invalid_html_tags,
    rustdoc::broken_intra_doc_links
)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

mod any;
mod convert;
#[doc(hidden)]
pub mod fuzz_targets;
mod uds;

pub use any::{AnyError, any_from_json, json_from_any, type_url};
pub use convert::{
    ConvertError, config_data_from_json, config_data_to_json, device_from_crd,
    device_with_model_defaults, model_from_crd,
};
pub use uds::{
    DEFAULT_DMI_SOCKET, UdsError, bind_uds, connect_uds, connect_uds_lazy, serve_listener,
    serve_uds,
};

pub use v1beta1::device_manager_service_client::DeviceManagerServiceClient;
pub use v1beta1::device_manager_service_server::{
    DeviceManagerService, DeviceManagerServiceServer,
};
pub use v1beta1::device_mapper_service_client::DeviceMapperServiceClient;
pub use v1beta1::device_mapper_service_server::{DeviceMapperService, DeviceMapperServiceServer};
