//! Topics: the fixed subscription list (reference §4.4), MQTT filter matching, where a received
//! message goes, and the `sub_topics` table that remembers subscriptions made for the cloud.

use crate::metamanager::store::{MetaStore, StoreError};
use rusqlite::params;
use std::collections::BTreeSet;

/// MQTT filter matching and validation, shared with the cloud router.
pub use kubeedge_shared::topic::{matches, valid_filter, valid_topic};

/// Subscribed on every connection, in both KubeEdge forms: v1.15 device IDs are one topic level
/// (`<name>`), v1.17+ IDs two (`<namespace>/<name>`).
pub const FIXED_TOPICS: &[&str] = &[
    "$hw/events/upload/#",
    "$hw/events/device/+/state/update",
    "$hw/events/device/+/+/state/update",
    "$hw/events/device/+/twin/+",
    "$hw/events/device/+/+/twin/+",
    "$hw/events/node/+/membership/get",
    "SYS/dis/upload_records",
    "+/user/#",
];

/// Where a received message goes (reference §4.4: first match wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// `$hw/events/device…` and `$hw/events/node…`: devicetwin.
    Twin,
    /// Everything else: to the cloud as an `upload` message.
    Cloud,
}

impl Destination {
    pub fn of(topic: &str) -> Destination {
        if topic.starts_with("$hw/events/device") || topic.starts_with("$hw/events/node") {
            Destination::Twin
        } else {
            Destination::Cloud
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Destination::Twin => "twin",
            Destination::Cloud => "cloud",
        }
    }
}

/// The filters the bus listens to: [`FIXED_TOPICS`] plus those subscribed for the cloud.
#[derive(Debug, Default, Clone)]
pub struct Subscriptions {
    added: BTreeSet<String>,
}

impl Subscriptions {
    pub fn with(added: impl IntoIterator<Item = String>) -> Self {
        Subscriptions {
            added: added.into_iter().collect(),
        }
    }

    /// Adds a cloud subscription; false when the bus already listens to exactly this filter.
    pub fn add(&mut self, filter: &str) -> bool {
        !FIXED_TOPICS.contains(&filter) && self.added.insert(filter.to_string())
    }

    /// Removes a cloud subscription; false when it was not one (fixed filters stay).
    pub fn remove(&mut self, filter: &str) -> bool {
        self.added.remove(filter)
    }

    pub fn matches(&self, topic: &str) -> bool {
        self.all().any(|f| matches(f, topic))
    }

    /// Every filter, fixed first.
    pub fn all(&self) -> impl Iterator<Item = &str> {
        FIXED_TOPICS
            .iter()
            .copied()
            .chain(self.added.iter().map(String::as_str))
    }
}

/// The `sub_topics` table (`topic text NOT NULL PRIMARY KEY`, created with the other tables).
pub mod sub_topics {
    use super::*;

    pub async fn load(store: &MetaStore) -> Result<Vec<String>, StoreError> {
        store
            .call(|conn| {
                let mut stmt =
                    conn.prepare(r#"SELECT "topic" FROM "sub_topics" ORDER BY "topic""#)?;
                let rows = stmt
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    pub async fn insert(store: &MetaStore, topic: &str) -> Result<(), StoreError> {
        let topic = topic.to_string();
        store
            .call(move |conn| {
                conn.execute(
                    r#"INSERT OR REPLACE INTO "sub_topics" ("topic") VALUES (?1)"#,
                    params![topic],
                )?;
                Ok(())
            })
            .await
    }

    pub async fn delete(store: &MetaStore, topic: &str) -> Result<(), StoreError> {
        let topic = topic.to_string();
        store
            .call(move |conn| {
                conn.execute(
                    r#"DELETE FROM "sub_topics" WHERE "topic" = ?1"#,
                    params![topic],
                )?;
                Ok(())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_and_node_topics_go_to_devicetwin_the_rest_to_the_cloud() {
        for t in [
            "$hw/events/device/dev-1/twin/update",
            "$hw/events/device/default/dev-1/state/update",
            "$hw/events/node/edge-1/membership/get",
            "$hw/events/devices-are-a-prefix-match-too",
        ] {
            assert_eq!(Destination::of(t), Destination::Twin, "{t}");
        }
        for t in [
            "$hw/events/upload/x",
            "SYS/dis/upload_records",
            "a/user/b",
            "rule/topic",
            "$hw/events/connected/dev",
        ] {
            assert_eq!(Destination::of(t), Destination::Cloud, "{t}");
        }
    }

    #[test]
    fn fixed_filters_take_both_device_id_forms() {
        let s = Subscriptions::default();
        for t in [
            "$hw/events/device/dev-1/twin/update",
            "$hw/events/device/dev-1/twin/get",
            "$hw/events/device/ns/dev-1/twin/update",
            "$hw/events/device/dev-1/state/update",
            "$hw/events/device/ns/dev-1/state/update",
            "$hw/events/node/edge-1/membership/get",
            "$hw/events/upload/anything/below",
            "SYS/dis/upload_records",
            "app/user/x/y",
        ] {
            assert!(s.matches(t), "{t}");
        }
        for t in [
            // what devicetwin publishes must not come back to it
            "$hw/events/device/dev-1/twin/update/result",
            "$hw/events/device/dev-1/twin/update/delta",
            "$hw/events/node/edge-1/membership/get/result",
            "$hw/events/device/dev-1/updated",
            "other/topic",
            // `+/user/#` does not reach into `$` topics
            "$x/user/y",
        ] {
            assert!(!s.matches(t), "{t}");
        }
    }

    #[test]
    fn cloud_subscriptions_add_to_the_fixed_ones() {
        let mut s = Subscriptions::default();
        assert!(!s.matches("rule/temp"));
        assert!(s.add("rule/+"));
        assert!(!s.add("rule/+"));
        assert!(
            !s.add("$hw/events/upload/#"),
            "a fixed filter is not added twice"
        );
        assert!(s.matches("rule/temp"));
        assert_eq!(s.all().count(), FIXED_TOPICS.len() + 1);
        assert!(s.remove("rule/+"));
        assert!(!s.remove("$hw/events/upload/#"), "fixed filters stay");
        assert!(!s.matches("rule/temp"));
    }

    #[tokio::test]
    async fn sub_topics_persist_across_reopening_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edgecore.db");
        {
            let store = MetaStore::open(&path).await.unwrap();
            assert!(sub_topics::load(&store).await.unwrap().is_empty());
            sub_topics::insert(&store, "rule/b").await.unwrap();
            sub_topics::insert(&store, "rule/a").await.unwrap();
            sub_topics::insert(&store, "rule/a").await.unwrap();
            sub_topics::insert(&store, "gone").await.unwrap();
            sub_topics::delete(&store, "gone").await.unwrap();
            sub_topics::delete(&store, "never-there").await.unwrap();
            store.close().await;
        }
        let store = MetaStore::open(&path).await.unwrap();
        assert_eq!(
            sub_topics::load(&store).await.unwrap(),
            ["rule/a", "rule/b"]
        );
        let ddl: String = store
            .call(|c| {
                Ok(c.query_row(
                    "SELECT sql FROM sqlite_master WHERE name = 'sub_topics'",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
            .unwrap();
        assert!(
            ddl.contains(r#""topic" text NOT NULL PRIMARY KEY"#),
            "{ddl}"
        );
    }
}
