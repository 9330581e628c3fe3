//! devicetwin's tables in the edge database, as KubeEdge creates them (devices reference
//! §3.2: `device`, `device_attr`, `device_twin`), plus `device_twin_unreported`: the devices
//! whose twin changes the cloud has not confirmed yet (kubeedge-rs; KubeEdge drops reports
//! made offline). All writes run on metamanager's database thread, each in one transaction.

use crate::metamanager::{MetaStore, StoreError};
use rusqlite::{Connection, OptionalExtension, params};
use std::collections::BTreeMap;

pub const DDL: &str = r#"
CREATE TABLE IF NOT EXISTS "device" (
    "id" varchar(64) NOT NULL PRIMARY KEY,
    "name" text,
    "description" text,
    "state" text,
    "last_online" text
);
CREATE TABLE IF NOT EXISTS "device_attr" (
    "id" integer NOT NULL PRIMARY KEY AUTOINCREMENT,
    "deviceid" text,
    "name" text,
    "description" text,
    "value" text,
    "optional" bool,
    "attr_type" text,
    "metadata" text
);
CREATE TABLE IF NOT EXISTS "device_twin" (
    "id" integer NOT NULL PRIMARY KEY AUTOINCREMENT,
    "deviceid" text,
    "name" text,
    "description" text,
    "expected" text,
    "actual" text,
    "expected_meta" text,
    "actual_meta" text,
    "expected_version" text,
    "actual_version" text,
    "optional" bool,
    "attr_type" text,
    "metadata" text
);
CREATE TABLE IF NOT EXISTS "device_twin_unreported" (
    "deviceid" text NOT NULL PRIMARY KEY
);
"#;

/// One `device` row with its twins.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceRow {
    pub id: String,
    pub name: String,
    pub description: String,
    pub state: String,
    pub last_online: String,
    pub twins: BTreeMap<String, TwinRow>,
}

/// One `device_twin` row. Values are `None` when deleted (SQL NULL).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TwinRow {
    pub expected: Option<String>,
    pub actual: Option<String>,
    /// JSON `{"timestamp": ms}`.
    pub expected_meta: Option<String>,
    pub actual_meta: Option<String>,
    /// JSON `{"cloud": n, "edge": n}`.
    pub expected_version: Option<String>,
    pub actual_version: Option<String>,
    pub optional: bool,
    pub attr_type: String,
    pub metadata: Option<String>,
}

pub async fn create_tables(store: &MetaStore) -> Result<(), StoreError> {
    store
        .call(|c| c.execute_batch(DDL).map_err(StoreError::from))
        .await
}

/// Every device with its twins, and the IDs whose changes are unreported.
pub async fn load(store: &MetaStore) -> Result<(Vec<DeviceRow>, Vec<String>), StoreError> {
    store
        .call(|c| {
            let mut devices: BTreeMap<String, DeviceRow> = BTreeMap::new();
            let mut stmt = c.prepare(
                r#"SELECT "id","name","description","state","last_online" FROM "device""#,
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(DeviceRow {
                    id: r.get(0)?,
                    name: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                    description: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                    state: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                    last_online: r.get::<_, Option<String>>(4)?.unwrap_or_default(),
                    twins: BTreeMap::new(),
                })
            })?;
            for row in rows {
                let row = row?;
                devices.insert(row.id.clone(), row);
            }
            let mut stmt = c.prepare(
                r#"SELECT "deviceid","name","expected","actual","expected_meta","actual_meta",
                   "expected_version","actual_version","optional","attr_type","metadata"
                   FROM "device_twin""#,
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?.unwrap_or_default(),
                    r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                    TwinRow {
                        expected: r.get(2)?,
                        actual: r.get(3)?,
                        expected_meta: r.get(4)?,
                        actual_meta: r.get(5)?,
                        expected_version: r.get(6)?,
                        actual_version: r.get(7)?,
                        optional: r.get::<_, Option<bool>>(8)?.unwrap_or(true),
                        attr_type: r.get::<_, Option<String>>(9)?.unwrap_or_default(),
                        metadata: r.get(10)?,
                    },
                ))
            })?;
            for row in rows {
                let (device, name, twin) = row?;
                if let Some(d) = devices.get_mut(&device) {
                    d.twins.insert(name, twin);
                }
            }
            let mut stmt = c.prepare(r#"SELECT "deviceid" FROM "device_twin_unreported""#)?;
            let unreported = stmt
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok((devices.into_values().collect(), unreported))
        })
        .await
}

pub async fn insert_device(store: &MetaStore, d: DeviceRow) -> Result<(), StoreError> {
    store
        .call(move |c| {
            c.execute(
                r#"INSERT OR REPLACE INTO "device" ("id","name","description","state","last_online")
                   VALUES (?1,?2,?3,?4,?5)"#,
                params![d.id, d.name, d.description, d.state, d.last_online],
            )?;
            Ok(())
        })
        .await
}

pub async fn update_state(
    store: &MetaStore,
    id: String,
    state: String,
    last_online: String,
) -> Result<(), StoreError> {
    store
        .call(move |c| {
            c.execute(
                r#"UPDATE "device" SET "state"=?2, "last_online"=?3 WHERE "id"=?1"#,
                params![id, state, last_online],
            )?;
            Ok(())
        })
        .await
}

/// Removes the device, its attributes, twins and unreported mark.
pub async fn delete_device(store: &MetaStore, id: String) -> Result<(), StoreError> {
    store
        .call(move |c| {
            c.execute(r#"DELETE FROM "device" WHERE "id"=?1"#, params![id])?;
            c.execute(
                r#"DELETE FROM "device_attr" WHERE "deviceid"=?1"#,
                params![id],
            )?;
            c.execute(
                r#"DELETE FROM "device_twin" WHERE "deviceid"=?1"#,
                params![id],
            )?;
            c.execute(
                r#"DELETE FROM "device_twin_unreported" WHERE "deviceid"=?1"#,
                params![id],
            )?;
            Ok(())
        })
        .await
}

/// Twins of several devices in one transaction (each row updated by `(deviceid, name)` or
/// inserted), each device marked as having changes the cloud has not confirmed.
pub async fn write_twin_batch(
    store: &MetaStore,
    devices: Vec<(String, Vec<(String, TwinRow)>)>,
) -> Result<(), StoreError> {
    store
        .call(move |c| {
            for (id, twins) in &devices {
                for (name, t) in twins {
                    upsert_twin(c, id, name, t)?;
                }
                c.prepare_cached(
                    r#"INSERT OR IGNORE INTO "device_twin_unreported" ("deviceid") VALUES (?1)"#,
                )?
                .execute(params![id])?;
            }
            Ok(())
        })
        .await
}

fn upsert_twin(c: &Connection, id: &str, name: &str, t: &TwinRow) -> Result<(), StoreError> {
    let existing: Option<i64> = c
        .query_row(
            r#"SELECT "id" FROM "device_twin" WHERE "deviceid"=?1 AND "name"=?2"#,
            params![id, name],
            |r| r.get(0),
        )
        .optional()?;
    let values = params![
        id,
        name,
        t.expected,
        t.actual,
        t.expected_meta,
        t.actual_meta,
        t.expected_version,
        t.actual_version,
        t.optional,
        t.attr_type,
        t.metadata
    ];
    match existing {
        Some(row) => {
            let mut stmt = c.prepare_cached(
                r#"UPDATE "device_twin" SET "deviceid"=?1,"name"=?2,"expected"=?3,"actual"=?4,
                   "expected_meta"=?5,"actual_meta"=?6,"expected_version"=?7,"actual_version"=?8,
                   "optional"=?9,"attr_type"=?10,"metadata"=?11 WHERE "id"=?12"#,
            )?;
            let mut all: Vec<&dyn rusqlite::ToSql> = values.to_vec();
            all.push(&row);
            stmt.execute(all.as_slice())?;
        }
        None => {
            c.prepare_cached(
                r#"INSERT INTO "device_twin" ("deviceid","name","description","expected","actual",
                   "expected_meta","actual_meta","expected_version","actual_version","optional",
                   "attr_type","metadata") VALUES (?1,?2,'',?3,?4,?5,?6,?7,?8,?9,?10,?11)"#,
            )?
            .execute(values)?;
        }
    }
    Ok(())
}

/// The cloud confirmed the device's changes.
pub async fn mark_reported(store: &MetaStore, id: String) -> Result<(), StoreError> {
    store
        .call(move |c| {
            c.execute(
                r#"DELETE FROM "device_twin_unreported" WHERE "deviceid"=?1"#,
                params![id],
            )?;
            Ok(())
        })
        .await
}
