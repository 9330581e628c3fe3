//! The dynamic controller (devices reference §6.4–§6.6): the cloud end of the edges'
//! MetaServers. An edge sends an Application (a Kubernetes API request of one of its apps);
//! it is checked against the node restriction (`access.rs`), run against the apiserver with
//! cloudcore's credentials, and answered (`applicationResponse`, parent = the request).
//! A `watch` Application registers a listener (`listeners.rs`): the matching objects, then
//! their changes, are sent to that edge only, as KubeEdge's dynamiccontroller sends them
//! (`<ns>/<kind>/<name>`, source `dynamiccontroller`, ACKed with the object's version).
//! `watchapp/sync` replaces an edge's listeners with the ones it lists.

mod access;
mod listeners;

use super::rest::{self, ApiRequest};
use crate::cloudhub::HubSink;
use access::{Access, Decision};
use kubeedge_shared::application::{self, AppKey, Application};
use kubeedge_shared::{Message, StatusError};
use listeners::Listeners;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

/// How a resource is served: found by discovery, kept for later requests.
#[derive(Debug, Clone)]
pub struct Served {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
}

impl Served {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The URL path of a collection or object.
    fn path(&self, ns: Option<&str>, name: Option<&str>, sub: &str) -> String {
        let mut p = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        if let (true, Some(ns)) = (self.namespaced, ns) {
            p.push_str(&format!("/namespaces/{ns}"));
        }
        p.push('/');
        p.push_str(&self.plural);
        if let Some(n) = name {
            p.push('/');
            p.push_str(n);
            if !sub.is_empty() {
                p.push('/');
                p.push_str(sub);
            }
        }
        p
    }
}

#[derive(Clone)]
pub struct DynamicController {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    hub: Arc<dyn HubSink>,
    served: RwLock<HashMap<(String, String, String), Served>>,
    listeners: Listeners,
}

impl DynamicController {
    pub fn new(client: kube::Client, hub: Arc<dyn HubSink>, cancel: CancellationToken) -> Self {
        DynamicController {
            inner: Arc::new(Inner {
                listeners: Listeners::new(client.clone(), hub.clone(), cancel),
                client,
                hub,
                served: RwLock::new(HashMap::new()),
            }),
        }
    }

    /// Forgets the watch registrations of a node that disconnected (unless it is connected
    /// again already): nothing is kept for edges that never come back.
    pub fn node_disconnected(&self, node: &str) {
        if !self.inner.hub.is_connected(node) {
            self.inner.listeners.forget(node);
        }
    }

    /// Handles one message of an edge's MetaServer (in a task of its own).
    pub fn dispatch(&self, node: String, msg: Message) {
        let this = self.clone();
        tokio::spawn(async move {
            let reply = if msg.route.resource == application::WATCH_SYNC_RESOURCE {
                this.watch_sync(&node, &msg).await
            } else {
                match Application::from_message(&msg) {
                    Ok(app) => this.handle(&node, app).await.to_response(&msg),
                    Err(e) => {
                        tracing::warn!(%node, error = %e, "malformed Application from an edge; refused");
                        let mut app = Application::new(&node, "", "", Vec::new(), Vec::new(), "");
                        app.status = application::status::FAILED.into();
                        app.reason = e;
                        app.to_response(&msg)
                    }
                }
            };
            if let Err(e) = this.inner.hub.send(&node, reply) {
                tracing::debug!(%node, error = %e, "answer to a MetaServer request not sent");
            }
        });
    }

    async fn watch_sync(&self, node: &str, msg: &Message) -> Message {
        let failed: serde_json::Map<String, Value> = match application::watch_sync_apps(msg) {
            Ok(apps) => {
                let mut keep = Vec::new();
                let mut failed = serde_json::Map::new();
                for mut app in apps {
                    app.nodename = node.to_string();
                    match self.register(node, &app).await {
                        Ok(()) => keep.push(app.id.clone()),
                        Err(e) => {
                            app.reject(&e);
                            failed.insert(
                                app.id.clone(),
                                serde_json::to_value(&app).unwrap_or(Value::Null),
                            );
                        }
                    }
                }
                self.inner.listeners.retain(node, &keep);
                failed
            }
            Err(e) => {
                tracing::warn!(%node, error = %e, "malformed watch sync; ignored");
                serde_json::Map::new()
            }
        };
        let mut reply = Message::response_to(msg, Value::Object(failed));
        reply.route.source = kubeedge_shared::operation::source::DYNAMIC_CONTROLLER.into();
        reply.route.group = kubeedge_shared::Group::Resource;
        reply.route.operation = kubeedge_shared::Operation::ApplicationResponse;
        reply
    }

    async fn register(&self, node: &str, app: &Application) -> Result<(), StatusError> {
        let key = AppKey::parse(&app.key).map_err(|e| StatusError::new(400, "BadRequest", e))?;
        let served = self.served(&key.group, &key.version, &key.resource).await?;
        let decision = access::decide(&Access {
            node,
            verb: "watch",
            group: &key.group,
            resource: &key.resource,
            namespace: key.namespace.as_deref(),
            name: key.name.as_deref(),
        });
        let options: Value = serde_json::from_slice(&app.option).unwrap_or(json!({}));
        let mut field = options["fieldSelector"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match decision {
            Decision::Deny(why) => return Err(StatusError::new(403, "Forbidden", why)),
            Decision::AllowNodePods | Decision::AllowIfPodOnNode => {
                if !field.is_empty() {
                    field.push(',');
                }
                field.push_str(&format!("spec.nodeName={node}"));
            }
            Decision::Allow => {}
        }
        if let Some(name) = &key.name {
            if !field.is_empty() {
                field.push(',');
            }
            field.push_str(&format!("metadata.name={name}"));
        }
        self.inner
            .listeners
            .add(listeners::Listener {
                id: app.id.clone(),
                node: node.to_string(),
                served,
                namespace: key.namespace.clone(),
                label_selector: options["labelSelector"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                field_selector: field,
            })
            .await
    }

    /// Runs one Application and fills in its answer.
    async fn handle(&self, node: &str, mut app: Application) -> Application {
        // The session's node, whatever the Application says.
        app.nodename = node.to_string();
        match self.run(node, &app).await {
            Ok(body) => app.approve(&body),
            Err(e) => {
                tracing::debug!(%node, key = %app.key, verb = %app.verb, code = e.code(), "MetaServer request refused");
                app.reject(&e);
            }
        }
        app
    }

    async fn run(&self, node: &str, app: &Application) -> Result<Value, StatusError> {
        if app.verb == "get" && is_discovery_path(&app.key) {
            // KubeEdge's pass-through: discovery documents, readable by every edge.
            return self.call(get_request(&app.key)?).await;
        }
        let key = AppKey::parse(&app.key).map_err(|e| StatusError::new(400, "BadRequest", e))?;
        if !matches!(
            app.verb.as_str(),
            "get" | "list" | "watch" | "create" | "update" | "updatestatus" | "patch" | "delete"
        ) {
            return Err(StatusError::new(
                405,
                "MethodNotAllowed",
                format!(
                    "verb {:?} is not supported by the dynamic controller",
                    app.verb
                ),
            ));
        }
        let served = self.served(&key.group, &key.version, &key.resource).await?;
        let verb = if app.verb == "updatestatus" {
            "update"
        } else {
            app.verb.as_str()
        };
        let decision = access::decide(&Access {
            node,
            verb,
            group: &key.group,
            resource: &key.resource,
            namespace: key.namespace.as_deref(),
            name: key.name.as_deref(),
        });
        if let Decision::Deny(why) = &decision {
            return Err(StatusError::new(403, "Forbidden", why.clone()));
        }
        if app.verb == "watch" {
            self.register(node, app).await?;
            return Ok(json!({}));
        }
        let options: Value = serde_json::from_slice(&app.option).unwrap_or(json!({}));
        let sub = if app.verb == "updatestatus" {
            "status".to_string()
        } else {
            app.subresource.clone()
        };
        let ns = key.namespace.as_deref();
        let name = key.name.as_deref();
        if decision == Decision::AllowIfPodOnNode {
            let bound_to = match (app.verb.as_str(), name) {
                ("create", _) | (_, None) => serde_json::from_slice::<Value>(&app.req_body)
                    .ok()
                    .and_then(|b| {
                        b.pointer("/spec/nodeName")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    }),
                _ => self
                    .call(get_request(&served.path(ns, name, ""))?)
                    .await?
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            };
            if bound_to.as_deref() != Some(node) {
                return Err(StatusError::new(
                    403,
                    "Forbidden",
                    format!(
                        "edge node {node:?} may only {} pods bound to it (node restriction)",
                        app.verb
                    ),
                ));
            }
        }
        let req = match app.verb.as_str() {
            "get" => get_request(&served.path(ns, name, &sub))?,
            "list" => {
                let mut field = options["fieldSelector"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if decision == Decision::AllowNodePods {
                    if !field.is_empty() {
                        field.push(',');
                    }
                    field.push_str(&format!("spec.nodeName={node}"));
                }
                let mut q = form_urlencoded_pairs(&[
                    (
                        "labelSelector",
                        options["labelSelector"].as_str().unwrap_or_default(),
                    ),
                    ("fieldSelector", &field),
                ]);
                let path = served.path(ns, None, "");
                if !q.is_empty() {
                    q.insert(0, '?');
                }
                get_request(&format!("{path}{q}"))?
            }
            "create" => body_request(
                http::Method::POST,
                &served.path(ns, None, ""),
                "application/json",
                app.req_body.clone(),
            )?,
            "update" | "updatestatus" => body_request(
                http::Method::PUT,
                &served.path(ns, name, &sub),
                "application/json",
                app.req_body.clone(),
            )?,
            "patch" => {
                let ty = options["PatchType"]
                    .as_str()
                    .unwrap_or("application/merge-patch+json");
                let data = application::decode_base64(options["Data"].as_str().unwrap_or_default())
                    .map_err(|e| StatusError::new(400, "BadRequest", format!("patch data: {e}")))?;
                let sub = options["Subresources"][0]
                    .as_str()
                    .unwrap_or(&sub)
                    .to_string();
                body_request(http::Method::PATCH, &served.path(ns, name, &sub), ty, data)?
            }
            "delete" => body_request(
                http::Method::DELETE,
                &served.path(ns, name, ""),
                "application/json",
                serde_json::to_vec(&options).unwrap_or_default(),
            )?,
            other => {
                return Err(StatusError::new(
                    405,
                    "MethodNotAllowed",
                    format!("verb {other:?} is not supported by the dynamic controller"),
                ));
            }
        };
        let mut out = self.call(req).await?;
        normalise(&mut out, &served);
        Ok(out)
    }

    async fn call(&self, req: ApiRequest) -> Result<Value, StatusError> {
        rest::call(&self.inner.client, req)
            .await
            .map_err(|e| rest::status_error(&e))
    }

    /// Finds how `group/version/plural` is served (discovery, cached).
    async fn served(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<Served, StatusError> {
        let k = (group.to_string(), version.to_string(), plural.to_string());
        if let Some(s) = self
            .inner
            .served
            .read()
            .ok()
            .and_then(|m| m.get(&k).cloned())
        {
            return Ok(s);
        }
        let path = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let list = self.call(get_request(&path)?).await?;
        let found = list["resources"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["name"] == plural))
            .ok_or_else(|| {
                StatusError::new(
                    404,
                    "NotFound",
                    format!(
                        "the server could not find the requested resource ({plural} in {path})"
                    ),
                )
            })?;
        let served = Served {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            kind: found["kind"].as_str().unwrap_or_default().into(),
            namespaced: found["namespaced"].as_bool().unwrap_or(true),
        };
        if let Ok(mut m) = self.inner.served.write() {
            m.insert(k, served.clone());
        }
        Ok(served)
    }
}

/// `/version`, `/api`, `/apis`, `/api/<v>`, `/apis/<g>`, `/apis/<g>/<v>`.
fn is_discovery_path(path: &str) -> bool {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let safe = segs.iter().all(|s| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    });
    safe && matches!(
        segs.as_slice(),
        ["version"] | ["api"] | ["apis"] | ["api", _] | ["apis", _] | ["apis", _, _]
    )
}

fn get_request(path: &str) -> Result<ApiRequest, StatusError> {
    http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| StatusError::new(400, "BadRequest", e.to_string()))
}

fn body_request(
    method: http::Method,
    path: &str,
    ty: &str,
    body: Vec<u8>,
) -> Result<ApiRequest, StatusError> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, ty)
        .body(body)
        .map_err(|e| StatusError::new(400, "BadRequest", e.to_string()))
}

fn form_urlencoded_pairs(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", percent(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The shape objects reach edges in, from answers and from listeners alike: `apiVersion` and
/// `kind` on every object (list items too), no `managedFields`.
pub fn normalise(v: &mut Value, served: &Served) {
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for item in items {
            normalise_object(item, served);
        }
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
    } else if v.get("kind").and_then(Value::as_str) != Some("Status") {
        normalise_object(v, served);
    }
}

fn normalise_object(o: &mut Value, served: &Served) {
    if let Some(m) = o.as_object_mut() {
        m.entry("apiVersion")
            .or_insert_with(|| json!(served.api_version()));
        m.entry("kind").or_insert_with(|| json!(served.kind));
    }
    if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_shapes_follow_the_api_layout() {
        let s = Served {
            group: "".into(),
            version: "v1".into(),
            plural: "services".into(),
            kind: "Service".into(),
            namespaced: true,
        };
        assert_eq!(
            s.path(Some("a"), Some("web"), "status"),
            "/api/v1/namespaces/a/services/web/status"
        );
        assert_eq!(s.path(None, None, ""), "/api/v1/services");
        let mut list = json!({"kind": "ServiceList", "metadata": {}, "items": [
            {"metadata": {"name": "web", "managedFields": [{}]}}]});
        normalise(&mut list, &s);
        assert_eq!(list["items"][0]["kind"], "Service");
        assert_eq!(list["items"][0]["apiVersion"], "v1");
        assert!(list["items"][0]["metadata"].get("managedFields").is_none());
        assert!(is_discovery_path("/apis/example.com/v1"));
        assert!(is_discovery_path("/api"));
        assert!(!is_discovery_path("/api/v1/pods"));
        assert!(!is_discovery_path("/apis/a/../b"));
        assert_eq!(
            form_urlencoded_pairs(&[("labelSelector", "app=web,x in (a)"), ("fieldSelector", "")]),
            "labelSelector=app%3Dweb%2Cx%20in%20%28a%29"
        );
    }
}
