use super::*;
use crate::selectors::Filter;
use serde_json::json;

fn put(t: &Table, ns: &str, name: &str, labels: Value) -> Arc<Obj> {
    let v = json!({"metadata": {"name": name, "namespace": ns, "labels": labels}});
    match t
        .mutate(&(ns.into(), name.into()), |_| Ok(Mutation::Put(v)))
        .unwrap()
    {
        Outcome::Created(o) | Outcome::Updated(o) => o,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn paginated_list_sees_the_snapshot_of_its_first_page() {
    let store = Store::new(StoreConfig::default());
    let t = store.table("", "configmaps");
    for i in 0..5 {
        put(&t, "a", &format!("cm{i}"), json!({}));
    }
    let first = t
        .list(Some("a"), None, None, Some(2), &Filter::default())
        .unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.remaining, Some(3));
    // Changes after the first page must not show up in later pages.
    t.mutate(&("a".into(), "cm3".into()), |_| Ok(Mutation::Remove))
        .unwrap();
    put(&t, "a", "cm9", json!({}));
    let mut names: Vec<String> = first.items.iter().map(|o| o.name().to_string()).collect();
    let mut after = first.next.clone();
    while let Some(k) = after {
        let page = t
            .list(
                Some("a"),
                Some(first.rv),
                Some(&k),
                Some(2),
                &Filter::default(),
            )
            .unwrap();
        assert_eq!(page.rv, first.rv);
        names.extend(page.items.iter().map(|o| o.name().to_string()));
        after = page.next;
    }
    assert_eq!(names, vec!["cm0", "cm1", "cm2", "cm3", "cm4"]);
}

#[test]
fn watch_from_an_evicted_resource_version_is_gone() {
    let store = Store::new(StoreConfig {
        history_limit: 3,
        watch_capacity: 8,
    });
    let t = store.table("", "configmaps");
    let first = put(&t, "a", "x0", json!({}));
    for i in 1..6 {
        put(&t, "a", &format!("x{i}"), json!({}));
    }
    let err = t
        .watch(
            None,
            Arc::new(Filter::default()),
            WatchStart::After(first.rv),
            false,
        )
        .err()
        .unwrap();
    assert_eq!(err.code, 410);
    let ok = t
        .watch(
            None,
            Arc::new(Filter::default()),
            WatchStart::After(store.current_rv() - 1),
            false,
        )
        .unwrap();
    assert_eq!(ok.initial.len(), 1);
}

#[test]
fn an_object_leaving_a_selector_is_deleted_for_that_watcher() {
    let store = Store::new(StoreConfig::default());
    let t = store.table("", "configmaps");
    put(&t, "a", "x", json!({"app": "web"}));
    let filter = Filter {
        labels: crate::selectors::parse_labels("app=web").unwrap(),
        fields: vec![],
    };
    let mut reg = t
        .watch(
            None,
            Arc::new(filter),
            WatchStart::After(store.current_rv()),
            false,
        )
        .unwrap();
    put(&t, "a", "x", json!({"app": "db"}));
    match reg.rx.try_recv().unwrap() {
        WatchItem::Departed(o, rv) => {
            assert_eq!(o.label("app"), Some("web"));
            assert_eq!(rv, store.current_rv());
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_slow_watcher_is_dropped_without_blocking_writers() {
    let store = Store::new(StoreConfig {
        history_limit: 100,
        watch_capacity: 2,
    });
    let t = store.table("", "configmaps");
    let mut reg = t
        .watch(
            None,
            Arc::new(Filter::default()),
            WatchStart::After(store.current_rv()),
            false,
        )
        .unwrap();
    for i in 0..5 {
        put(&t, "a", &format!("x{i}"), json!({}));
    }
    assert_eq!(t.watcher_count(), 0);
    let mut got = 0;
    while reg.rx.try_recv().is_ok() {
        got += 1;
    }
    assert_eq!(got, 2);
}
