//! The RBAC objects of the cluster and what they grant one service account: the
//! `ServiceAccountAccess` spec (KubeEdge's policy controller, `VisitRulesFor`).
//!
//! Bindings are indexed by the principals their subjects name, so the bindings of a service
//! account are found without scanning every binding: a ServiceAccount subject and a User
//! subject `system:serviceaccount:<ns>:<name>` are the same user; the groups of a service
//! account are `system:serviceaccounts`, `system:serviceaccounts:<ns>` and
//! `system:authenticated` (Kubernetes' `serviceaccount.UserInfo` plus the authenticator's).

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use kube::ResourceExt;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub type ObjKey = (String, String);

/// Who a binding subject names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    User(String),
    Group(String),
}

/// The user name of a service account.
pub fn sa_user_name(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Every principal a service account's requests carry.
pub fn sa_principals(namespace: &str, name: &str) -> [Principal; 4] {
    [
        Principal::User(sa_user_name(namespace, name)),
        Principal::Group("system:serviceaccounts".into()),
        Principal::Group(format!("system:serviceaccounts:{namespace}")),
        Principal::Group("system:authenticated".into()),
    ]
}

/// The principal a subject names; a ServiceAccount subject without a namespace takes the
/// binding's (`""` for ClusterRoleBindings: it then names nobody), as Kubernetes does.
pub fn subject_principal(subject: &Subject, binding_ns: &str) -> Option<Principal> {
    if subject.name.is_empty() {
        return None;
    }
    match subject.kind.as_str() {
        "User" => Some(Principal::User(subject.name.clone())),
        "Group" => Some(Principal::Group(subject.name.clone())),
        "ServiceAccount" => {
            let ns = match subject.namespace.as_deref() {
                Some(ns) if !ns.is_empty() => ns,
                _ => binding_ns,
            };
            (!ns.is_empty()).then(|| Principal::User(sa_user_name(ns, &subject.name)))
        }
        _ => None,
    }
}

/// Does a binding (its subjects, its namespace) apply to service account `ns/name`?
#[cfg(test)]
pub fn applies_to_sa(subjects: &[Subject], binding_ns: &str, ns: &str, name: &str) -> bool {
    let mine = sa_principals(ns, name);
    subjects
        .iter()
        .filter_map(|s| subject_principal(s, binding_ns))
        .any(|p| mine.contains(&p))
}

/// The cluster's service accounts and RBAC objects.
#[derive(Default)]
pub struct Rbac {
    pub service_accounts: HashMap<ObjKey, ServiceAccount>,
    pub roles: HashMap<ObjKey, Role>,
    pub cluster_roles: HashMap<String, ClusterRole>,
    role_bindings: HashMap<ObjKey, RoleBinding>,
    cluster_role_bindings: HashMap<String, ClusterRoleBinding>,
    rb_index: HashMap<Principal, BTreeSet<ObjKey>>,
    crb_index: HashMap<Principal, BTreeSet<String>>,
}

fn key_of<K: kube::Resource>(o: &K) -> ObjKey {
    (o.namespace().unwrap_or_default(), o.name_any())
}

fn principals(subjects: Option<&Vec<Subject>>, binding_ns: &str) -> BTreeSet<Principal> {
    subjects
        .map(|s| s.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|s| subject_principal(s, binding_ns))
        .collect()
}

fn unindex<K: Ord>(index: &mut HashMap<Principal, BTreeSet<K>>, ps: BTreeSet<Principal>, key: &K) {
    for p in ps {
        if let Some(set) = index.get_mut(&p) {
            set.remove(key);
            if set.is_empty() {
                index.remove(&p);
            }
        }
    }
}

impl Rbac {
    pub fn put_role_binding(&mut self, rb: RoleBinding) {
        let key = key_of(&rb);
        self.delete_role_binding(&key);
        for p in principals(rb.subjects.as_ref(), &key.0) {
            self.rb_index.entry(p).or_default().insert(key.clone());
        }
        self.role_bindings.insert(key, rb);
    }

    pub fn delete_role_binding(&mut self, key: &ObjKey) {
        if let Some(old) = self.role_bindings.remove(key) {
            let ps = principals(old.subjects.as_ref(), &key.0);
            unindex(&mut self.rb_index, ps, key);
        }
    }

    pub fn role_binding_keys(&self) -> Vec<ObjKey> {
        self.role_bindings.keys().cloned().collect()
    }

    pub fn put_cluster_role_binding(&mut self, crb: ClusterRoleBinding) {
        let name = crb.name_any();
        self.delete_cluster_role_binding(&name);
        for p in principals(crb.subjects.as_ref(), "") {
            self.crb_index.entry(p).or_default().insert(name.clone());
        }
        self.cluster_role_bindings.insert(name, crb);
    }

    pub fn delete_cluster_role_binding(&mut self, name: &String) {
        if let Some(old) = self.cluster_role_bindings.remove(name) {
            let ps = principals(old.subjects.as_ref(), "");
            unindex(&mut self.crb_index, ps, name);
        }
    }

    pub fn cluster_role_binding_names(&self) -> Vec<String> {
        self.cluster_role_bindings.keys().cloned().collect()
    }

    fn rules_of(&self, kind: &str, name: &str, binding_ns: &str) -> Option<&[PolicyRule]> {
        let rules = match kind {
            "Role" if !binding_ns.is_empty() => self
                .roles
                .get(&(binding_ns.to_string(), name.to_string()))?
                .rules
                .as_ref(),
            "ClusterRole" => self.cluster_roles.get(name)?.rules.as_ref(),
            _ => return None,
        };
        Some(rules.map(Vec::as_slice).unwrap_or_default())
    }

    /// The `ServiceAccountAccess` object of service account `ns/name`, without its
    /// resourceVersion; `None` when the service account does not exist.
    pub fn access(&self, ns: &str, name: &str) -> Option<Value> {
        let sa = self
            .service_accounts
            .get(&(ns.to_string(), name.to_string()))?;
        let uid = sa.metadata.uid.clone().unwrap_or_default();
        let mine = sa_principals(ns, name);
        let rbs: BTreeSet<&ObjKey> = mine
            .iter()
            .filter_map(|p| self.rb_index.get(p))
            .flatten()
            .collect();
        let crbs: BTreeSet<&String> = mine
            .iter()
            .filter_map(|p| self.crb_index.get(p))
            .flatten()
            .collect();
        let access_rb: Vec<Value> = rbs
            .into_iter()
            .filter_map(|k| {
                let rb = self.role_bindings.get(k)?;
                let rules = self.rules_of(&rb.role_ref.kind, &rb.role_ref.name, &k.0)?;
                Some(json!({"roleBinding": clean(rb), "rules": rules}))
            })
            .collect();
        let access_crb: Vec<Value> = crbs
            .into_iter()
            .filter_map(|n| {
                let crb = self.cluster_role_bindings.get(n)?;
                if crb.role_ref.kind != "ClusterRole" {
                    return None;
                }
                let rules = self.rules_of("ClusterRole", &crb.role_ref.name, "")?;
                Some(json!({"clusterRoleBinding": clean(crb), "rules": rules}))
            })
            .collect();
        Some(json!({
            "apiVersion": super::API_VERSION,
            "kind": super::KIND,
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "spec": {
                "serviceAccount": clean(sa),
                "serviceAccountUid": uid,
                "accessRoleBinding": access_rb,
                "accessClusterRoleBinding": access_crb,
            },
            "status": {},
        }))
    }
}

/// The object as JSON without `managedFields` (nobody at the edge reads them).
fn clean<K: serde::Serialize>(o: &K) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or(Value::Null);
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    v
}
