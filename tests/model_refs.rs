//! The protocol models (`model/*.pml`, checked by spin: `model/check`) and the code point at
//! each other, and this test keeps both directions true (no database, std only):
//!
//! - every `@code <item>` of a model names something that exists: a field of `TableSql`,
//!   `LimitSql` or `RegistrySql` or a method of `Dialect` in `src/dialect/mod.rs`, or
//!   `<file under src/>::<function>`;
//! - every item a model names says so in its comments (`Modelled in model/<file>.pml ...`);
//! - every `model/<file>.pml (<steps>)` in the code's comments names a model that exists and
//!   steps (`@step <name>`) it has.
//!
//! Fails when a statement or function a model stands for is renamed or removed, or a step
//! the code names is: tried by naming `TableSql::ackk` in model/lease.pml (`... names
//! TableSql::ackk, which is not there: TableSql has no ackk ...`), renaming its step `extend`
//! (`src/dialect/mod.rs:.. names step "extend" of model/lease.pml, which has no such step`),
//! and deleting the `Modelled in` line of `TableSql::relock` (`model/row_lock.pml names
//! TableSql::relock, but its comments in src/dialect/mod.rs do not name the model back`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The structs (and the trait) of `src/dialect/mod.rs` whose members a model may name.
const KINDS: &[(&str, &str)] = &[
    ("TableSql", "pub(crate) struct TableSql {"),
    ("LimitSql", "pub(crate) struct LimitSql {"),
    ("RegistrySql", "pub(crate) struct RegistrySql {"),
    ("Dialect", "pub(crate) trait Dialect"),
];

/// One model: its file name, its steps, and the items each comment names (with the step the
/// comment belongs to, if any).
struct Model {
    file: String,
    steps: BTreeSet<String>,
    items: BTreeMap<String, BTreeSet<String>>,
}

fn word(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The item after `@code `: `Kind::member` or `path/file.rs::function`; `None` for prose.
fn item_at(s: &str) -> Option<String> {
    let item: String = s
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '/' | '.'))
        .collect();
    let (head, member) = item.rsplit_once("::")?;
    let valid = !member.is_empty() && member == word(member);
    let known = KINDS.iter().any(|(k, _)| *k == head)
        || (head.ends_with(".rs") && !head.starts_with('/') && !head.contains(".."));
    (valid && known).then_some(item)
}

/// Every `/* .. */` comment of a Promela text.
fn comments(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("/*") {
        let Some(len) = rest[at + 2..].find("*/") else {
            break;
        };
        out.push(&rest[at + 2..at + 2 + len]);
        rest = &rest[at + 2 + len + 2..];
    }
    out
}

fn models() -> Vec<Model> {
    let dir = root().join("model");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no model in {}", dir.display());
    files
        .iter()
        .map(|path| {
            let text = read(path);
            let mut model = Model {
                file: path.file_name().unwrap().to_string_lossy().into_owned(),
                steps: BTreeSet::new(),
                items: BTreeMap::new(),
            };
            for comment in comments(&text) {
                let step = comment
                    .split("@step ")
                    .nth(1)
                    .map(word)
                    .filter(|s| !s.is_empty());
                if let Some(step) = &step {
                    model.steps.insert(step.clone());
                }
                for part in comment.split("@code ").skip(1) {
                    if let Some(item) = item_at(part) {
                        let steps = model.items.entry(item).or_default();
                        steps.extend(step.clone());
                    }
                }
            }
            model
        })
        .collect()
}

/// The comment lines (doc, plain, attributes) directly above line `at` of `lines`.
fn block_above(lines: &[&str], at: usize) -> String {
    let mut out = Vec::new();
    let mut i = at;
    while i > 0 {
        let line = lines[i - 1].trim();
        if line.starts_with("//") || line.starts_with("#[") {
            out.push(line);
            i -= 1;
        } else {
            break;
        }
    }
    out.reverse();
    out.join("\n")
}

/// Where `item` is, and the comments above it; `Err` says why it is not there.
fn locate(item: &str) -> Result<(PathBuf, String), String> {
    let (head, member) = item.rsplit_once("::").unwrap();
    let is_fn = |line: &str| {
        [format!("fn {member}("), format!("fn {member}<")]
            .iter()
            .any(|f| line.contains(f.as_str()))
    };
    if let Some((kind, start)) = KINDS.iter().find(|(k, _)| *k == head) {
        let path = root().join("src/dialect/mod.rs");
        let text = read(&path);
        let lines: Vec<&str> = text.lines().collect();
        let Some(first) = lines.iter().position(|l| l.starts_with(start)) else {
            return Err(format!("src/dialect/mod.rs has no {kind}"));
        };
        for (i, line) in lines.iter().enumerate().skip(first + 1) {
            if *line == "}" {
                break;
            }
            let field = line.trim_start().starts_with(&format!("pub {member}:"));
            let method = *kind == "Dialect" && is_fn(line);
            if field || method {
                return Ok((path, block_above(&lines, i)));
            }
        }
        return Err(format!("{kind} has no {member} in src/dialect/mod.rs"));
    }
    let path = root().join("src").join(head);
    if !path.is_file() {
        return Err(format!("there is no src/{head}"));
    }
    let text = read(&path);
    let lines: Vec<&str> = text.lines().collect();
    match lines.iter().position(|l| is_fn(l)) {
        Some(i) => Ok((path, block_above(&lines, i))),
        None => Err(format!("src/{head} has no function {member}")),
    }
}

#[test]
fn every_step_names_code_that_exists_and_names_it_back() {
    let mut problems = Vec::new();
    let mut named = 0;
    for model in models() {
        assert!(
            !model.items.is_empty() && !model.steps.is_empty(),
            "model/{} names no code (@code) or no step (@step)",
            model.file
        );
        for (item, steps) in &model.items {
            named += 1;
            match locate(item) {
                Err(why) => problems.push(format!(
                    "model/{} ({}) names {item}, which is not there: {why}",
                    model.file,
                    match steps.is_empty() {
                        true => "outside a step".to_string(),
                        false => format!(
                            "step {}",
                            steps.iter().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    }
                )),
                Ok((path, comments)) => {
                    let back = format!("model/{}", model.file);
                    if !comments.contains("Modelled in") || !comments.contains(&back) {
                        problems.push(format!(
                            "model/{} names {item}, but its comments in {} do not name the \
                             model back: add `/// Modelled in {back} ({})`",
                            model.file,
                            path.strip_prefix(root()).unwrap_or(&path).display(),
                            steps.iter().cloned().collect::<Vec<_>>().join(", ")
                        ));
                    }
                }
            }
        }
    }
    assert!(named > 20, "only {named} items named by the models");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `model/<file>.pml` and the steps in the parentheses after it, for each mention in `text`
/// (a comment's text, lines joined).
fn mentions(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("model/") {
        rest = &rest[at + "model/".len()..];
        let name = word(rest);
        let Some(after) = rest[name.len()..].strip_prefix(".pml") else {
            continue;
        };
        let file = format!("{name}.pml");
        let steps = match after.strip_prefix(" (") {
            Some(inner) => inner
                .split(')')
                .next()
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .collect(),
            None => Vec::new(),
        };
        out.push((file, steps));
    }
    out
}

#[test]
fn the_code_names_models_and_steps_that_exist() {
    let models: BTreeMap<String, BTreeSet<String>> =
        models().into_iter().map(|m| (m.file, m.steps)).collect();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut seen = 0;
    for path in files {
        let text = read(&path);
        let lines: Vec<&str> = text.lines().collect();
        // A comment block at a time, so a mention wrapped over two lines is read whole.
        let mut i = 0;
        while i < lines.len() {
            if !lines[i].trim_start().starts_with("//") {
                i += 1;
                continue;
            }
            let first = i;
            let mut block = Vec::new();
            while i < lines.len() && lines[i].trim_start().starts_with("//") {
                block.push(lines[i].trim_start().trim_start_matches('/').trim());
                i += 1;
            }
            let block = block.join(" ");
            if !block.contains("Modelled in") {
                continue;
            }
            for (file, steps) in mentions(&block) {
                seen += 1;
                let at = format!(
                    "{}:{}",
                    path.strip_prefix(root()).unwrap_or(&path).display(),
                    first + 1
                );
                let Some(have) = models.get(&file) else {
                    problems.push(format!("{at} names model/{file}, which does not exist"));
                    continue;
                };
                for step in steps {
                    if !have.contains(&step) {
                        problems.push(format!(
                            "{at} names step {step:?} of model/{file}, which has no such step"
                        ));
                    }
                }
            }
        }
    }
    assert!(seen > 20, "only {seen} mentions of the models in src/");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The parsers above read what they should (so a passing run means something).
#[test]
fn the_checker_reads_items_and_mentions() {
    assert_eq!(
        item_at("TableSql::claim */"),
        Some("TableSql::claim".into())
    );
    assert_eq!(
        item_at("consuming/form/lease.rs::renew_chunk\n"),
        Some("consuming/form/lease.rs::renew_chunk".into())
    );
    assert_eq!(item_at("<item>\" (a field"), None);
    assert_eq!(item_at("Other::thing"), None);
    assert_eq!(
        mentions("Modelled in model/lease.pml (claim, renew), model/fifo.pml."),
        [
            (
                "lease.pml".to_string(),
                vec!["claim".into(), "renew".into()]
            ),
            ("fifo.pml".to_string(), vec![])
        ]
    );
    assert!(locate("TableSql::no_such_statement").is_err());
    assert!(locate("consuming/form/lease.rs::no_such_function").is_err());
    assert!(locate("Dialect::lease_renew").is_ok());
}
