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
/// `VARCHAR(255)`, `LONGBLOB NULL`, ...); `None` for a type none of ours maps to.
pub(crate) fn family(ty: &str) -> Option<Family> {
    let t = ty.to_ascii_lowercase();
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
/// the families that work, and whether `ADD COLUMN` can add it to a table with rows (it is
/// nullable or has a default).
#[derive(Debug, Clone)]
pub(crate) struct ColumnDef {
    pub name: String,
    pub ddl: String,
    pub accepts: Vec<Family>,
    pub addable: bool,
}

/// What is wrong with the columns `found` (`(name, type)`) against `needed`: missing columns
/// and columns of a type the statements cannot use, one line each.
pub(crate) fn problems(needed: &[ColumnDef], found: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for col in needed {
        match found.iter().find(|(name, _)| name == &col.name) {
            None => out.push(format!("column {} is missing", col.name)),
            Some((_, ty)) => {
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
    }

    #[test]
    fn missing_and_mistyped_columns_are_named() {
        let def = |name: &str, f: Family| ColumnDef {
            name: name.into(),
            ddl: String::new(),
            accepts: vec![f],
            addable: true,
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
