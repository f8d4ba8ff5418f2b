//! The pgbench scripts of `benches/pgbench`, run beside the PostgreSQL cells.

/// The pgbench scripts of `BURNDOWN_PGBENCH_DIR`, rewritten to a table of their own.
pub(crate) struct PgBench {
    pub(crate) table: String,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) schema: Vec<String>,
    pub(crate) args: Vec<String>,
    pub(crate) password: Option<String>,
    pub(crate) client: postgres::Client,
}

impl PgBench {
    /// `None` (with a note) when pgbench or the scripts are missing.
    pub(crate) fn new(url: &str, src: &str) -> Option<PgBench> {
        let ok = std::process::Command::new("pgbench")
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        let schema = std::fs::read_to_string(format!("{src}/pg-schema.sql")).ok();
        let (true, Some(schema)) = (ok, schema) else {
            eprintln!("note: pgbench or {src}/pg-schema.sql missing: no pgbench figures");
            return None;
        };
        let table = format!("burndown_jobs_{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("sqlbroker-burndown-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        for script in [
            "pg-row_lock1.sql",
            "pg-lease1.sql",
            "pg-lease100.sql",
            "pg-commit1.sql",
        ] {
            let text = std::fs::read_to_string(format!("{src}/{script}")).ok()?;
            std::fs::write(dir.join(script), text.replace("jobs", &table)).ok()?;
        }
        let schema = schema
            .replace("jobs", &table)
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        // postgres://user[:password]@host[:port]/db
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let (auth, hostdb) = rest.rsplit_once('@').unwrap_or(("", rest));
        let (user, password) = match auth.split_once(':') {
            Some((u, p)) => (u.to_string(), Some(p.to_string())),
            None => (auth.to_string(), None),
        };
        let (hostport, db) = hostdb.split_once('/').unwrap_or((hostdb, "postgres"));
        let db = db.split('?').next().unwrap_or(db);
        let (host, port) = hostport.split_once(':').unwrap_or((hostport, "5432"));
        let mut args = vec!["-h".into(), host.into(), "-p".into(), port.into()];
        if !user.is_empty() {
            args.extend(["-U".into(), user]);
        }
        args.push(db.into());
        let client = postgres::Client::connect(url, postgres::NoTls).ok()?;
        Some(PgBench {
            table,
            dir,
            schema,
            args,
            password,
            client,
        })
    }

    /// Reloads the table and runs `script` on `clients` clients for `secs`: jobs/s.
    pub(crate) fn run(
        &mut self,
        script: &str,
        clients: usize,
        secs: u64,
        rows: u64,
    ) -> Result<f64, String> {
        for stmt in &self.schema {
            self.client
                .batch_execute(stmt)
                .map_err(|e| format!("schema: {e}"))?;
        }
        let mut cmd = std::process::Command::new("pgbench");
        cmd.args(["-n", "-f"])
            .arg(self.dir.join(script))
            .args(["-c", &clients.to_string(), "-j", &clients.to_string()])
            .args(["-T", &secs.to_string()])
            .args(&self.args);
        if let Some(p) = &self.password {
            cmd.env("PGPASSWORD", p);
        }
        let out = cmd.output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let tps = text
            .lines()
            .find(|l| l.starts_with("tps = "))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse::<f64>().ok());
        match (out.status.success(), tps) {
            (true, Some(tps)) => Ok(tps * rows as f64),
            _ => Err(format!(
                "{}\n{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }
}

impl Drop for PgBench {
    fn drop(&mut self) {
        let _ = self
            .client
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", self.table));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
