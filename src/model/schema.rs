//! Schema checks: does a table in the database have the columns its description names, of
//! types the statements can use? Pure logic over what the database reports (`information_schema`
//! on the servers, `pragma_table_info` on SQLite); the dialects supply the queries and the
//! column definitions.

/// A column type, as far as the statements care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Int,
    Float,
    Text,
    Bytes,
    Time,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Int => "integer",
            Family::Float => "floating point",
            Family::Text => "text",
            Family::Bytes => "binary",
            Family::Time => "timestamp",
        }
    }
}

/// The family of a type as a database names it (`bigint`, `timestamp with time zone`,
/// `VARCHAR(255)`, `LONGBLOB NULL`, `varchar collate utf8mb4_nopad_bin`, ...); `None` for a
/// type none of ours maps to.
pub(crate) fn family(ty: &str) -> Option<Family> {
    let t = ty.to_ascii_lowercase();
    let t = t.split(" collate ").next().unwrap_or_default();
    let has = |w: &str| t.contains(w);
    if has("int") {
        Some(Family::Int)
    } else if has("char") || has("text") || has("clob") {
        Some(Family::Text)
    } else if has("bytea") || has("blob") || has("binary") {
        Some(Family::Bytes)
    } else if has("timestamp") || has("datetime") {
        Some(Family::Time)
    } else if has("double") || has("real") || has("float") || has("numeric") || has("decimal") {
        Some(Family::Float)
    } else {
        None
    }
}

/// A column a description needs: its name, its definition for `CREATE TABLE` / `ADD COLUMN`,
/// the families that work, whether `ADD COLUMN` can add it to a table with rows (it is
/// nullable or has a default), and the collations its text may be in (empty: any).
#[derive(Debug, Clone)]
pub(crate) struct ColumnDef {
    pub name: String,
    pub ddl: String,
    pub accepts: Vec<Family>,
    pub addable: bool,
    /// The statements by which `migrate` adds the column when `ALTER TABLE .. ADD COLUMN
    /// <ddl>` is not the way (empty: it is): `created_at`, whose rows already there must read
    /// `NULL` rather than the migration's time.
    pub add: Vec<String>,
    /// MySQL's dedup key and group: the byte-exact collations. A type as the database reports
    /// it ends with ` collate <name>` when the column has one.
    pub collations: &'static [&'static str],
}

impl ColumnDef {
    /// The collation of a text column whose reported type is `ty` when it is not one this
    /// column may be in.
    fn wrong_collation<'a>(&self, ty: &'a str) -> Option<&'a str> {
        if self.collations.is_empty() || family(ty) != Some(Family::Text) {
            return None;
        }
        let collation = ty.rsplit_once(" collate ").map_or("", |(_, c)| c);
        (!self.collations.contains(&collation)).then_some(collation)
    }
}

/// The columns of `needed` that `found` has as text in a collation other than theirs: what
/// `migrate` converts.
pub(crate) fn to_convert<'a>(
    needed: &'a [ColumnDef],
    found: &[(String, String)],
) -> Vec<&'a ColumnDef> {
    needed
        .iter()
        .filter(|col| {
            found
                .iter()
                .any(|(name, ty)| name == &col.name && col.wrong_collation(ty).is_some())
        })
        .collect()
}

/// How a problem of [`problems`] that `migrate` fixes by converting the column ends.
pub(crate) const CONVERTIBLE: &str = "(Broker::migrate converts it)";

/// What is wrong with the columns `found` (`(name, type)`) against `needed`: missing columns,
/// columns of a type the statements cannot use and compared text in a collation that is not
/// byte-exact, one line each.
pub(crate) fn problems(needed: &[ColumnDef], found: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for col in needed {
        match found.iter().find(|(name, _)| name == &col.name) {
            None => out.push(format!("column {} is missing", col.name)),
            Some((_, ty)) => {
                if let Some(collation) = col.wrong_collation(ty) {
                    out.push(format!(
                        "column {} compares text by collation {collation}, not byte for byte: \
                         keys differing in case or trailing spaces would collide {CONVERTIBLE}",
                        col.name
                    ));
                }
                if let Some(f) = family(ty) {
                    if !col.accepts.contains(&f) {
                        let want: Vec<&str> = col.accepts.iter().map(|f| f.name()).collect();
                        out.push(format!(
                            "column {} is {ty} ({}), described as {}",
                            col.name,
                            f.name(),
                            want.join(" or ")
                        ));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_of_the_three_databases() {
        for (ty, f) in [
            ("bigint", Family::Int),
            ("INTEGER", Family::Int),
            ("smallint", Family::Int),
            ("timestamp with time zone", Family::Time),
            ("timestamp without time zone", Family::Time),
            ("datetime", Family::Time),
            ("character varying", Family::Text),
            ("varchar", Family::Text),
            ("mediumtext", Family::Text),
            ("TEXT", Family::Text),
            ("bytea", Family::Bytes),
            ("longblob", Family::Bytes),
            ("BLOB", Family::Bytes),
            ("double precision", Family::Float),
            ("REAL", Family::Float),
        ] {
            assert_eq!(family(ty), Some(f), "{ty}");
        }
        assert_eq!(family("jsonb"), None);
        // MySQL reports a text column's collation with its type.
        assert_eq!(
            family("varchar collate utf8mb4_general_ci"),
            Some(Family::Text)
        );
        assert_eq!(family("longblob"), Some(Family::Bytes));
    }

    #[test]
    fn compared_text_in_a_collation_is_converted() {
        let key = ColumnDef {
            name: "dedup_key".into(),
            ddl: String::new(),
            accepts: vec![Family::Text],
            addable: true,
            add: Vec::new(),
            collations: &["utf8mb4_nopad_bin", "utf8mb4_0900_bin"],
        };
        let free = ColumnDef {
            name: "note".into(),
            collations: &[],
            ..key.clone()
        };
        let needed = [key, free];
        let old = [
            (
                "dedup_key".to_string(),
                "varchar collate utf8mb4_general_ci".to_string(),
            ),
            ("note".into(), "varchar collate utf8mb4_general_ci".into()),
        ];
        assert_eq!(
            problems(&needed, &old),
            [
                "column dedup_key compares text by collation utf8mb4_general_ci, not byte for \
              byte: keys differing in case or trailing spaces would collide \
              (Broker::migrate converts it)"
            ]
        );
        let convert: Vec<&str> = to_convert(&needed, &old)
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(convert, ["dedup_key"]);
        // `utf8mb4_bin` pads spaces: not byte-exact either.
        let padded = [(
            "dedup_key".to_string(),
            "varchar collate utf8mb4_bin".to_string(),
        )];
        assert_eq!(to_convert(&needed, &padded).len(), 1);
        for ok in ["utf8mb4_nopad_bin", "utf8mb4_0900_bin"] {
            let found = [
                ("dedup_key".to_string(), format!("varchar collate {ok}")),
                ("note".into(), "varchar collate utf8mb4_general_ci".into()),
            ];
            assert!(problems(&needed, &found).is_empty(), "{ok}");
            assert!(to_convert(&needed, &found).is_empty(), "{ok}");
        }
        // PostgreSQL and SQLite report no collation and need none.
        let pg = [("note".to_string(), "text".to_string())];
        assert!(problems(&needed[1..], &pg).is_empty());
    }

    #[test]
    fn missing_and_mistyped_columns_are_named() {
        let def = |name: &str, f: Family| ColumnDef {
            name: name.into(),
            ddl: String::new(),
            accepts: vec![f],
            addable: true,
            add: Vec::new(),
            collations: &[],
        };
        let needed = [
            def("id", Family::Int),
            def("run_at", Family::Time),
            def("k", Family::Text),
            def("n", Family::Int),
        ];
        let found = [
            ("id".to_string(), "bigint".to_string()),
            ("run_at".into(), "text".into()),
            ("n".into(), "jsonb".into()),
        ];
        assert_eq!(
            problems(&needed, &found),
            [
                "column run_at is text (text), described as timestamp",
                "column k is missing"
            ]
        );
    }
}
