//! The API verbs with Kubernetes semantics (create, get, list, update, patch, delete, and the
//! subresources `token` and `binding`), shared by the HTTP handlers and the controllers:
//! reads in `read.rs`, `create.rs`, `update.rs` (PUT, PATCH, computed writes), `delete.rs`,
//! `subresources.rs`.

mod create;
mod delete;
mod read;
mod scale;
mod subresources;
mod update;

pub use create::{create, ensure_namespace_defaults, establish_crd};
pub use delete::{delete, delete_collection};
pub use read::{ListRequest, get, list};
pub use scale::{get_scale, write_scale};
pub use subresources::{bind_pod, create_token};
pub use update::{patch, put_computed, update};

use create::{admit_create, after_create, check_namespace, detached, parse_rv, scope_namespace};
use delete::after_remove;

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta::{self, name, now, now_time, set_path};
use crate::patch::{self, PatchType};
use crate::resources::ResourceInfo;
use crate::selectors::Filter;
use crate::state::State;
use crate::status::{ApiError, ApiResult, Cause};
use crate::store::{ListPage, Mutation, Obj, ObjKey, Outcome};
use crate::strategy;
use crate::tokens::{ISSUER, TokenClaims};

#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    pub subresource: Option<String>,
    /// The authenticated requester (None for the control plane's own writes).
    pub user: Option<Arc<crate::authn::UserInfo>>,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation_policy: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Reads a `DeleteOptions` body (may be empty) merged with query parameters.
    pub fn from_body(body: &Value) -> Self {
        Self {
            grace_period_seconds: body["gracePeriodSeconds"].as_i64(),
            uid: body["preconditions"]["uid"].as_str().map(str::to_string),
            resource_version: body["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_string),
            propagation_policy: body["propagationPolicy"]
                .as_str()
                .map(str::to_string)
                .or_else(|| {
                    (body["orphanDependents"].as_bool() == Some(true)).then(|| "Orphan".into())
                }),
            dry_run: body["dryRun"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "All")),
        }
    }
}

/// The result of a DELETE.
#[derive(Debug)]
pub enum Deleted {
    /// Gone from the store (the object at the deletion's resourceVersion).
    Removed(Arc<Obj>),
    /// Still present: graceful deletion or finalizers pending.
    Pending(Arc<Obj>),
}

pub(super) fn key(info: &ResourceInfo, ns: &str, name: &str) -> ObjKey {
    if info.namespaced {
        (ns.to_string(), name.to_string())
    } else {
        (String::new(), name.to_string())
    }
}
