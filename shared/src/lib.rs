//! The KubeEdge message schema and the pieces both cloudcore and edgecore need.
//!
//! Everything here follows the wire format of KubeEdge v1.15+ (beehive `model.Message`
//! carried as JSON text frames over the cloudhub WebSocket), see
//! `docs/kubeedge-protocol.md` §1–§3 (cited as "protocol §N" throughout).

pub mod application;
pub mod backoff;
pub mod clock;
pub mod codec;
pub mod config;
pub mod constants;
pub mod content;
pub mod devices;
pub mod duration;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod inventory;
pub mod link;
pub mod message;
pub mod names;
pub mod net;
pub mod nodetask;
pub mod operation;
pub mod pki;
pub mod resource;
pub mod resource_type;
pub mod selectors;
pub mod servicebus;
pub mod stream;
pub mod tls;
pub mod token;
pub mod topic;
pub mod wire;

pub use codec::{CodecError, FrameCodec};
pub use content::{ObjectResp, Status, StatusError};
pub use message::{Header, Message, Route};
pub use operation::{Group, Operation};
pub use resource::{ResourceError, ResourcePath};
pub use resource_type::ResourceType;
