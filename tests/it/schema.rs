//! The SQLite and the PostgreSQL schema after every migration, compared table by table and
//! column by column: the same tables, the same columns, each of the same kind and nullability.
//! The two stores run the same SQL (`src/store/sql/`), so a column that one engine's migrations
//! add and the other's forget is a bug of one engine only.

use rota::store::{PgStore, SqliteStore};
use std::collections::BTreeMap;

/// What the comparison tells apart of a column's type: the types the migrations declare, each
/// engine's spelling mapped to one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Integer,
    Real,
    Text,
    Bytes,
    Boolean,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Column {
    kind: Kind,
    nullable: bool,
}

/// Table, column: its kind and nullability.
type Schema = BTreeMap<String, BTreeMap<String, Column>>;

/// The differences both schemas have today, each for a reason. The test fails on any other
/// difference, and on one of these gone (then its entry goes too).
const KNOWN: &[&str] = &[
    // SQLite keeps a legacy of its early versions: on a table with a rowid, a `PRIMARY KEY` of
    // another type than INTEGER does not imply NOT NULL, and the SQLite migrations declare
    // these keys `TEXT PRIMARY KEY` without it; PostgreSQL's primary keys are never NULL. The
    // store never writes a NULL key (each is bound from a string, never an `Option`), and a
    // migration that added the NOT NULL would have to copy each table (SQLite cannot alter a
    // column).
    "agents.id: NULL allowed on SQLite only",
    "profile_order.provider: NULL allowed on SQLite only",
    "profiles.id: NULL allowed on SQLite only",
    "refresh_claims.profile_id: NULL allowed on SQLite only",
    "requests.id: NULL allowed on SQLite only",
    "usage_stats.profile_id: NULL allowed on SQLite only",
    // The usage series' windows with their next success, kept by PostgreSQL's audit writer;
    // SQLite's reads search `attempts` instead (docs/schema.md, "failure_windows").
    "failure_windows: a table on PostgreSQL only",
];

/// Every way the two schemas differ, in table and column order.
fn differences(sqlite: &Schema, postgres: &Schema) -> Vec<String> {
    let mut out = Vec::new();
    for (table, columns) in sqlite {
        let Some(theirs) = postgres.get(table) else {
            out.push(format!("{table}: a table on SQLite only"));
            continue;
        };
        for (name, ours) in columns {
            let Some(theirs) = theirs.get(name) else {
                out.push(format!("{table}.{name}: a column on SQLite only"));
                continue;
            };
            if ours.kind != theirs.kind {
                out.push(format!("{table}.{name}: {:?} on SQLite, {:?} on PostgreSQL", ours.kind, theirs.kind));
            }
            if ours.nullable != theirs.nullable {
                let only = if ours.nullable { "SQLite" } else { "PostgreSQL" };
                out.push(format!("{table}.{name}: NULL allowed on {only} only"));
            }
        }
        for name in theirs.keys().filter(|name| !columns.contains_key(*name)) {
            out.push(format!("{table}.{name}: a column on PostgreSQL only"));
        }
    }
    for table in postgres.keys().filter(|table| !sqlite.contains_key(*table)) {
        out.push(format!("{table}: a table on PostgreSQL only"));
    }
    out
}

/// The kind of a column SQLite declares `declared` in a table created by `table_sql`. SQLite
/// has no boolean type: the migrations declare a flag `INTEGER … CHECK (name IN (0, 1))`.
fn sqlite_kind(name: &str, declared: &str, table_sql: &str) -> Kind {
    match declared {
        "INTEGER" if table_sql.contains(&format!("CHECK ({name} IN (0, 1))")) => Kind::Boolean,
        "INTEGER" => Kind::Integer,
        "REAL" => Kind::Real,
        "TEXT" => Kind::Text,
        "BLOB" => Kind::Bytes,
        other => panic!("{name}: SQLite type {other} has no kind here yet: add it to sqlite_kind"),
    }
}

/// The kind of a column of PostgreSQL's `information_schema.columns.data_type`.
fn postgres_kind(name: &str, data_type: &str) -> Kind {
    match data_type {
        "bigint" | "integer" => Kind::Integer,
        "double precision" => Kind::Real,
        "text" => Kind::Text,
        "bytea" => Kind::Bytes,
        "boolean" => Kind::Boolean,
        other => panic!("{name}: PostgreSQL type {other} has no kind here yet: add it to postgres_kind"),
    }
}

/// The tables of an SQLite database but its own (`sqlite_%`) and sqlx's bookkeeping.
async fn sqlite_schema(pool: &sqlx::SqlitePool) -> Schema {
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, sql FROM sqlite_master
         WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut schema = Schema::new();
    for (table, sql) in tables {
        let columns: Vec<(String, String, bool, i64)> =
            sqlx::query_as("SELECT name, type, \"notnull\", pk FROM pragma_table_info($1)")
                .bind(&table)
                .fetch_all(pool)
                .await
                .unwrap();
        let keys = columns.iter().filter(|c| c.3 > 0).count();
        let without_rowid = sql.contains("WITHOUT ROWID");
        let mut out = BTreeMap::new();
        for (name, declared, not_null, pk) in columns {
            // Never NULL besides a NOT NULL column: the rowid (a lone INTEGER PRIMARY KEY) and
            // the key of a table without one.
            let rowid = pk > 0 && keys == 1 && declared == "INTEGER";
            let never_null = not_null || rowid || (pk > 0 && without_rowid);
            out.insert(name.clone(), Column { kind: sqlite_kind(&name, &declared, &sql), nullable: !never_null });
        }
        schema.insert(table, out);
    }
    schema
}

/// The base tables of the PostgreSQL database's schema but sqlx's bookkeeping and the audit
/// trail's day partitions.
async fn postgres_schema(pool: &sqlx::PgPool) -> Schema {
    let columns: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT c.table_name::text, c.column_name::text, c.data_type::text, c.is_nullable::text
         FROM information_schema.columns c
         JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
         WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
           AND c.table_name <> '_sqlx_migrations'
           AND NOT (SELECT relispartition FROM pg_class WHERE oid = to_regclass(quote_ident(c.table_name)))",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut schema = Schema::new();
    for (table, name, data_type, nullable) in columns {
        let column = Column { kind: postgres_kind(&name, &data_type), nullable: nullable == "YES" };
        schema.entry(table).or_default().insert(name, column);
    }
    schema
}

#[tokio::test]
async fn sqlite_and_postgres_have_the_same_tables_and_columns() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    let postgres = PgStore::open(&crate::support::postgres_database().await).await.unwrap();
    let (ours, theirs) = (sqlite_schema(sqlite.pool()).await, postgres_schema(postgres.pool()).await);

    assert_eq!(differences(&ours, &theirs), KNOWN, "the schemas differ otherwise than known");

    // A column one engine's migration would add alone is seen.
    sqlx::query("ALTER TABLE agents ADD COLUMN note TEXT").execute(sqlite.pool()).await.unwrap();
    let found = differences(&sqlite_schema(sqlite.pool()).await, &theirs);
    assert!(found.contains(&"agents.note: a column on SQLite only".to_string()), "{found:?}");
}

/// A hand-built table's columns: name, kind, nullable.
type Spec = [(&'static str, Kind, bool)];

fn schema(tables: &[(&str, &Spec)]) -> Schema {
    let columns =
        |c: &Spec| c.iter().map(|&(name, kind, nullable)| (name.to_string(), Column { kind, nullable })).collect();
    tables.iter().map(|(table, c)| (table.to_string(), columns(c))).collect()
}

#[test]
fn every_difference_between_two_schemas_is_found() {
    use Kind::*;
    let base: &Spec = &[("id", Text, false), ("enabled", Boolean, false), ("cost", Real, true)];
    assert_eq!(differences(&schema(&[("t", base)]), &schema(&[("t", base)])), Vec::<String>::new());

    let added: &Spec = &[("id", Text, false), ("enabled", Boolean, false), ("cost", Real, true), ("x", Integer, true)];
    assert_eq!(differences(&schema(&[("t", added)]), &schema(&[("t", base)])), ["t.x: a column on SQLite only"]);
    assert_eq!(differences(&schema(&[("t", base)]), &schema(&[("t", added)])), ["t.x: a column on PostgreSQL only"]);

    let changed: &Spec = &[("id", Text, true), ("enabled", Integer, false), ("cost", Real, true)];
    assert_eq!(
        differences(&schema(&[("t", changed)]), &schema(&[("t", base)])),
        ["t.enabled: Integer on SQLite, Boolean on PostgreSQL", "t.id: NULL allowed on SQLite only"]
    );

    assert_eq!(
        differences(&schema(&[("t", base), ("a", base)]), &schema(&[("t", base), ("z", base)])),
        ["a: a table on SQLite only", "z: a table on PostgreSQL only"]
    );
}

#[test]
fn sqlite_flags_are_booleans_and_other_integers_are_not() {
    let sql = "CREATE TABLE t (n INTEGER NOT NULL, on INTEGER NOT NULL CHECK (on IN (0, 1)), x REAL, b BLOB)";
    assert_eq!(sqlite_kind("on", "INTEGER", sql), Kind::Boolean);
    assert_eq!(sqlite_kind("n", "INTEGER", sql), Kind::Integer);
    assert_eq!(sqlite_kind("x", "REAL", sql), Kind::Real);
    assert_eq!(sqlite_kind("b", "BLOB", sql), Kind::Bytes);
    assert_eq!(postgres_kind("n", "integer"), postgres_kind("m", "bigint"));
}
