use super::*;
use serde_json::json;

async fn store() -> (tempfile::TempDir, MetaStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = MetaStore::open(dir.path().join("sub/edgecore.db"))
        .await
        .unwrap();
    (dir, s)
}

fn pod(name: &str, uid: &str, rv: &str) -> MetaRecord {
    MetaRecord::new(
        format!("default/pod/{name}"),
        "pod",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv}})
        .to_string(),
    )
}

#[tokio::test]
async fn upsert_replaces_and_get_returns_the_latest() {
    let (_d, s) = store().await;
    s.upsert(pod("a", "u1", "1")).await.unwrap();
    s.upsert(pod("a", "u1", "2")).await.unwrap();
    let v: Value = serde_json::from_str(&s.get("default/pod/a").await.unwrap().unwrap()).unwrap();
    assert_eq!(v["metadata"]["resourceVersion"], "2");
    assert_eq!(s.count().await.unwrap(), 1);
    assert_eq!(s.get("default/pod/missing").await.unwrap(), None);
}

#[tokio::test]
async fn tables_have_kubeedge_layout_and_wal_is_on() {
    let (d, s) = store().await;
    s.upsert(pod("a", "u1", "7")).await.unwrap();
    let conn = Connection::open(d.path().join("sub/edgecore.db")).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    use std::os::unix::fs::PermissionsExt;
    let perms = std::fs::metadata(d.path().join("sub/edgecore.db"))
        .unwrap()
        .permissions();
    assert_eq!(perms.mode() & 0o777, 0o600, "the database holds secrets");
    let cols = |t: &str| -> Vec<String> {
        let mut st = conn.prepare(&format!("PRAGMA table_info({t})")).unwrap();
        st.query_map([], |r| r.get::<_, String>(1))
            .unwrap()
            .map(|c| c.unwrap())
            .collect()
    };
    assert_eq!(cols("meta"), ["key", "type", "value"]);
    assert_eq!(
        cols("meta_v2"),
        [
            "key",
            "groupversionresource",
            "namespace",
            "name",
            "resourceversion",
            "value"
        ]
    );
    let (key, gvr, rv): (String, String, i64) = conn
        .query_row(
            "SELECT key, groupversionresource, resourceversion FROM meta_v2",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(key, "/core/v1/pods/default/a");
    assert_eq!(gvr, "/v1, Resource=pods");
    assert_eq!(rv, 7);
}

#[tokio::test]
async fn stale_redelivery_does_not_roll_an_object_back() {
    let (_d, s) = store().await;
    assert_eq!(
        s.upsert_object(pod("a", "u1", "10")).await.unwrap(),
        UpsertOutcome::Written
    );
    assert_eq!(
        s.upsert_object(pod("a", "u1", "9")).await.unwrap(),
        UpsertOutcome::KeptNewer { stored_rv: 10 }
    );
    // Same version again (a re-delivery) and a new incarnation are written.
    assert_eq!(
        s.upsert_object(pod("a", "u1", "10")).await.unwrap(),
        UpsertOutcome::Written
    );
    assert_eq!(
        s.upsert_object(pod("a", "u2", "3")).await.unwrap(),
        UpsertOutcome::Written
    );
    let v: Value = serde_json::from_str(&s.get("default/pod/a").await.unwrap().unwrap()).unwrap();
    assert_eq!(v["metadata"]["uid"], "u2");
}

#[test]
fn a_delete_naming_another_uid_keeps_the_newer_object() {
    let d = tempfile::tempdir().unwrap();
    let conn = open_connection(&d.path().join("edgecore.db")).unwrap();
    let cm = |uid: &str| {
        MetaRecord::new(
            "ns/configmap/cfg".to_string(),
            "configmap".to_string(),
            json!({"metadata": {"name": "cfg", "namespace": "ns", "uid": uid, "resourceVersion": "5"}})
                .to_string(),
        )
    };
    upsert_object_in(&conn, &cm("new")).unwrap();
    assert_eq!(
        delete_object_in(&conn, "ns/configmap/cfg", Some("old")).unwrap(),
        DeleteOutcome::UidMismatch {
            stored_uid: "new".into()
        }
    );
    assert!(stored_value(&conn, "ns/configmap/cfg").unwrap().is_some());
    assert_eq!(
        delete_object_in(&conn, "ns/configmap/cfg", Some("new")).unwrap(),
        DeleteOutcome::Deleted
    );
    upsert_object_in(&conn, &cm("x")).unwrap();
    assert_eq!(
        delete_object_in(&conn, "ns/configmap/cfg", None).unwrap(),
        DeleteOutcome::Deleted,
        "without a UID the key goes"
    );
    assert_eq!(
        delete_object_in(&conn, "ns/configmap/cfg", None).unwrap(),
        DeleteOutcome::Absent
    );
}

#[tokio::test]
async fn pod_delete_drops_the_tokens_bound_to_that_pod_only() {
    let (_d, s) = store().await;
    let token = |digest: &str, pod_uid: &str| {
        MetaRecord::new(
            format!("default/serviceaccounttoken/{digest}"),
            "serviceaccounttoken",
            json!({"namespace": "default", "serviceAccount": "default",
                   "pod": {"name": "a", "uid": pod_uid}, "expires": 4_000_000_000i64})
            .to_string(),
        )
    };
    s.upsert(pod("a", "u1", "1")).await.unwrap();
    s.upsert(pod("b", "u2", "1")).await.unwrap();
    for r in [token("t1", "u1"), token("t2", "u1"), token("t3", "u2")] {
        s.upsert(r).await.unwrap();
    }
    // A token not bound to a pod, and a corrupt row: neither blocks the delete.
    s.upsert(MetaRecord::new(
        "default/serviceaccounttoken/t4",
        "serviceaccounttoken",
        json!({"namespace": "default", "serviceAccount": "default", "pod": null, "expires": 0})
            .to_string(),
    ))
    .await
    .unwrap();
    s.upsert(MetaRecord::new(
        "default/serviceaccounttoken/t5",
        "serviceaccounttoken",
        "not json",
    ))
    .await
    .unwrap();
    assert_eq!(
        s.delete_pod("default/pod/a", Some("u1")).await.unwrap(),
        DeleteOutcome::Deleted
    );
    let left: Vec<String> = s
        .list_type("serviceaccounttoken")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(
        left,
        [
            "default/serviceaccounttoken/t3",
            "default/serviceaccounttoken/t4",
            "default/serviceaccounttoken/t5"
        ]
    );
    // A delete refused for another incarnation keeps that incarnation's tokens.
    assert!(matches!(
        s.delete_pod("default/pod/b", Some("u9")).await.unwrap(),
        DeleteOutcome::UidMismatch { .. }
    ));
    assert!(
        s.get("default/serviceaccounttoken/t3")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn many_pods_created_and_deleted_leave_no_rows_behind() {
    let (_d, s) = store().await;
    for i in 0..200 {
        let (name, uid) = (format!("p{i}"), format!("u{i}"));
        s.upsert(pod(&name, &uid, "1")).await.unwrap();
        s.upsert(MetaRecord::new(
            format!("default/podpatch/{name}"),
            "podpatch",
            r#"{"status":{}}"#,
        ))
        .await
        .unwrap();
        s.upsert(MetaRecord::new(
            format!("default/serviceaccounttoken/d{i}"),
            "serviceaccounttoken",
            json!({"pod": {"name": name, "uid": uid}, "expires": 4_000_000_000i64}).to_string(),
        ))
        .await
        .unwrap();
        assert_eq!(
            s.delete_pod(&format!("default/pod/{name}"), Some(&uid))
                .await
                .unwrap(),
            DeleteOutcome::Deleted
        );
    }
    assert_eq!(s.count().await.unwrap(), 0);
    assert!(s.list_v2("/core/v1/pods").await.unwrap().0.is_empty());
}

#[tokio::test]
async fn pod_delete_requires_the_stored_uid_and_drops_the_podpatch_row() {
    let (_d, s) = store().await;
    s.upsert(pod("a", "u1", "1")).await.unwrap();
    s.upsert(MetaRecord::new(
        "default/podpatch/a",
        "podpatch",
        r#"{"status":{}}"#,
    ))
    .await
    .unwrap();
    assert_eq!(
        s.delete_pod("default/pod/a", Some("other")).await.unwrap(),
        DeleteOutcome::UidMismatch {
            stored_uid: "u1".into()
        }
    );
    assert_eq!(
        s.delete_pod("default/pod/a", None).await.unwrap(),
        DeleteOutcome::UidMismatch {
            stored_uid: "u1".into()
        }
    );
    assert!(s.get("default/pod/a").await.unwrap().is_some());
    assert_eq!(
        s.delete_pod("default/pod/a", Some("u1")).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(s.get("default/pod/a").await.unwrap(), None);
    assert_eq!(s.get("default/podpatch/a").await.unwrap(), None);
    assert_eq!(
        s.delete_pod("default/pod/a", Some("u1")).await.unwrap(),
        DeleteOutcome::Absent
    );
    assert_eq!(s.count().await.unwrap(), 0);
}

#[tokio::test]
async fn queries_by_two_and_three_token_paths() {
    let (_d, s) = store().await;
    s.upsert(pod("a", "u1", "1")).await.unwrap();
    s.upsert(pod("b", "u2", "1")).await.unwrap();
    s.upsert(MetaRecord::new(
        "other/pod/c",
        "pod",
        r#"{"metadata":{"uid":"u3"}}"#,
    ))
    .await
    .unwrap();
    s.upsert(MetaRecord::new(
        "default/configmap/cm",
        "configmap",
        r#"{"data":{}}"#,
    ))
    .await
    .unwrap();
    let all_pods = s
        .query(&ResourcePath::parse("default/pod").unwrap())
        .await
        .unwrap();
    assert_eq!(
        all_pods.len(),
        3,
        "2-token queries list the type in every namespace"
    );
    let one = s
        .query(&ResourcePath::parse("default/pod/b").unwrap())
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert!(one[0].contains("\"u2\""));
    assert!(
        s.query(&ResourcePath::parse("default/pod/zz").unwrap())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        s.list_type("configmap").await.unwrap()[0].key,
        "default/configmap/cm"
    );
}

#[tokio::test]
async fn corrupt_values_do_not_break_reads_deletes_or_the_inventory() {
    let (_d, s) = store().await;
    s.upsert(MetaRecord::new("default/pod/bad", "pod", "{not json"))
        .await
        .unwrap();
    s.upsert(MetaRecord::new(
        "default/configmap/nouid",
        "configmap",
        r#"{"metadata":{}}"#,
    ))
    .await
    .unwrap();
    s.upsert(pod("good", "u1", "5")).await.unwrap();
    s.upsert(MetaRecord::new(
        "default/podpatch/good",
        "podpatch",
        "patch text",
    ))
    .await
    .unwrap();
    s.upsert(MetaRecord::new(
        "default/node/edge-1",
        "node",
        r#"{"metadata":{"uid":"n"}}"#,
    ))
    .await
    .unwrap();
    assert_eq!(
        s.query(&ResourcePath::parse("default/pod").unwrap())
            .await
            .unwrap()
            .len(),
        2
    );
    let inv = s.inventory().await.unwrap();
    assert_eq!(
        inv,
        vec![InventoryEntry {
            resource_type: "pod".into(),
            key: "default/pod/good".into(),
            uid: "u1".into(),
            resource_version: "5".into(),
        }]
    );
    // Overwriting a corrupt row and deleting one both work.
    assert_eq!(
        s.upsert_object(pod("bad", "u9", "1")).await.unwrap(),
        UpsertOutcome::Written
    );
    s.upsert(MetaRecord::new("default/pod/bad", "pod", "garbage"))
        .await
        .unwrap();
    assert_eq!(
        s.delete_pod("default/pod/bad", Some("u9")).await.unwrap(),
        DeleteOutcome::Deleted
    );
    s.integrity_check().await.unwrap();
}

#[tokio::test]
async fn rows_that_are_not_text_are_skipped_not_fatal() {
    let (d, s) = store().await;
    s.upsert(pod("good", "u1", "5")).await.unwrap();
    // Another tool (or a torn write) left a BLOB and invalid UTF-8 in `value`.
    let conn = Connection::open(d.path().join("sub/edgecore.db")).unwrap();
    conn.execute(
        "INSERT INTO meta (key, type, value) VALUES ('default/pod/blob', 'pod', X'00FF')",
        [],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO meta (key, type, value) VALUES ('default/pod/utf8', 'pod', CAST(X'C328' AS TEXT))",
        [],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO meta (key, type, value) VALUES ('default/pod/int', 'pod', 42)",
        [],
    )
    .unwrap();
    let listed = s
        .query(&ResourcePath::parse("default/pod").unwrap())
        .await
        .unwrap();
    assert!(listed.contains(&pod("good", "u1", "5").value), "{listed:?}");
    // The integer reads back as text "42"; the BLOB and the bad UTF-8 are skipped.
    assert_eq!(listed.len(), 2, "{listed:?}");
    let inv = s.inventory().await.unwrap();
    assert_eq!(inv.len(), 1, "{inv:?}");
    assert_eq!(inv[0].key, "default/pod/good");
}

#[tokio::test]
async fn replace_if_same_uid_never_resurrects_a_deleted_pod() {
    let (_d, s) = store().await;
    assert_eq!(
        s.replace_if_same_uid(pod("a", "u1", "2")).await.unwrap(),
        ReplaceOutcome::NotPresent
    );
    assert_eq!(s.get("default/pod/a").await.unwrap(), None);
    s.upsert(pod("a", "u1", "1")).await.unwrap();
    assert_eq!(
        s.replace_if_same_uid(pod("a", "u2", "2")).await.unwrap(),
        ReplaceOutcome::NotPresent
    );
    assert_eq!(
        s.replace_if_same_uid(pod("a", "u1", "2")).await.unwrap(),
        ReplaceOutcome::Replaced
    );
    assert!(
        s.get("default/pod/a")
            .await
            .unwrap()
            .unwrap()
            .contains("\"2\"")
    );
}

#[tokio::test]
async fn a_failing_job_does_not_undo_the_others_in_its_batch() {
    let (d, s) = store().await;
    let conn = Connection::open(d.path().join("sub/edgecore.db")).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON meta WHEN NEW.key = 'default/pod/bad'
         BEGIN SELECT RAISE(ABORT, 'refused by test trigger'); END;",
    )
    .unwrap();
    drop(conn);
    // Hold the database thread so that the writes below queue up and share a transaction.
    let blocker = s
        .submit(|_| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(())
        })
        .await
        .unwrap();
    let mut rxs = Vec::new();
    for name in ["a", "bad", "b"] {
        let r = pod(name, "u", "1");
        rxs.push(
            s.submit(move |c| {
                upsert_row(c, &r)?;
                mirror_v2(c, &r)
            })
            .await
            .unwrap(),
        );
    }
    blocker.await.unwrap().unwrap();
    let results: Vec<_> = futures_util::future::join_all(rxs).await;
    assert!(results[0].as_ref().unwrap().is_ok());
    let err = results[1].as_ref().unwrap().as_ref().unwrap_err();
    assert!(err.to_string().contains("refused by test trigger"), "{err}");
    assert!(results[2].as_ref().unwrap().is_ok());
    assert!(s.get("default/pod/a").await.unwrap().is_some());
    assert!(s.get("default/pod/b").await.unwrap().is_some());
    assert!(s.get("default/pod/bad").await.unwrap().is_none());
    // The failed row left no meta_v2 mirror behind either.
    let conn = Connection::open(d.path().join("sub/edgecore.db")).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM meta_v2", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
}

#[tokio::test]
async fn closed_store_refuses_jobs_and_reopens_with_the_data() {
    let (d, s) = store().await;
    s.upsert(pod("a", "u1", "1")).await.unwrap();
    s.close().await;
    assert!(matches!(
        s.get("default/pod/a").await,
        Err(StoreError::Closed)
    ));
    let again = MetaStore::open(d.path().join("sub/edgecore.db"))
        .await
        .unwrap();
    assert!(again.get("default/pod/a").await.unwrap().is_some());
}

#[test]
fn podpatch_keys_follow_pod_keys() {
    assert_eq!(podpatch_key("ns/pod/x").as_deref(), Some("ns/podpatch/x"));
    assert_eq!(podpatch_key("ns/configmap/x"), None);
}

/// The facts the caller takes from its value give the rows and outcomes the store's own
/// parse of the text gives.
#[test]
fn an_upsert_with_known_facts_writes_what_a_parsed_upsert_writes() {
    let d = tempfile::tempdir().unwrap();
    let parsed = open_connection(&d.path().join("parsed.db")).unwrap();
    let known = open_connection(&d.path().join("known.db")).unwrap();
    let rows = |c: &Connection| {
        let mut stmt = c
            .prepare("SELECT key, groupversionresource, namespace, name, resourceversion, value FROM meta_v2 ORDER BY key")
            .unwrap();
        stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, String>(5)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect::<Vec<_>>()
    };
    for (name, uid, rv) in [
        ("a", "u1", "5"),
        ("a", "u1", "3"),
        ("a", "u2", "1"),
        ("b", "u3", "9"),
    ] {
        let r = pod(name, uid, rv);
        let v: Value = serde_json::from_str(&r.value).unwrap();
        let by_parse = upsert_object_in(&parsed, &r).unwrap();
        let by_facts = upsert_known_object_in(&known, &r, Some(ObjectFacts::of(&v))).unwrap();
        assert_eq!(by_parse, by_facts, "{name} {uid} {rv}");
    }
    let (p, k) = (rows(&parsed), rows(&known));
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].0, "/core/v1/pods/default/a");
    assert_eq!(
        p[0].4, 1,
        "u1@3 was kept out as older, then u2@1 replaced it"
    );
    assert_eq!(p, k);
}
