//! KubeEdge's `target_urls` table (`url text NOT NULL PRIMARY KEY`): the cloud URLs the
//! router's servicebus → rest rules allow this node's applications (operation `start` adds
//! one, `stop` removes it). Kept in the edge database so they hold across restarts.

use crate::metamanager::store::{MetaStore, StoreError};
use rusqlite::params;

pub async fn create(store: &MetaStore) -> Result<(), StoreError> {
    store
        .call(|conn| {
            conn.execute_batch(
                r#"CREATE TABLE IF NOT EXISTS "target_urls" ("url" text NOT NULL PRIMARY KEY);"#,
            )?;
            Ok(())
        })
        .await
}

pub async fn load(store: &MetaStore) -> Result<Vec<String>, StoreError> {
    store
        .call(|conn| {
            let mut stmt = conn.prepare(r#"SELECT "url" FROM "target_urls" ORDER BY "url""#)?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
}

pub async fn insert(store: &MetaStore, url: &str) -> Result<(), StoreError> {
    let url = url.to_string();
    store
        .call(move |conn| {
            conn.execute(
                r#"INSERT OR REPLACE INTO "target_urls" ("url") VALUES (?1)"#,
                params![url],
            )?;
            Ok(())
        })
        .await
}

pub async fn delete(store: &MetaStore, url: &str) -> Result<(), StoreError> {
    let url = url.to_string();
    store
        .call(move |conn| {
            conn.execute(
                r#"DELETE FROM "target_urls" WHERE "url" = ?1"#,
                params![url],
            )?;
            Ok(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn urls_persist_across_reopening_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("edgecore.db");
        {
            let store = MetaStore::open(&db).await.unwrap();
            create(&store).await.unwrap();
            insert(&store, "http://b/").await.unwrap();
            insert(&store, "http://a/").await.unwrap();
            insert(&store, "http://a/").await.unwrap();
            delete(&store, "http://b/").await.unwrap();
            store.close().await;
        }
        let store = MetaStore::open(&db).await.unwrap();
        create(&store).await.unwrap();
        assert_eq!(load(&store).await.unwrap(), vec!["http://a/"]);
        store.close().await;
    }
}
