//! URL query parameters that sqlbroker reads itself before the driver parses the rest of the
//! URL (the TLS settings each driver does not parse, or parses differently).

/// Removes the query parameters named in `names` from `url`: the URL without them, and the
/// removed `(name, value)` pairs in their order, values percent-decoded. Other parameters are
/// left exactly as written.
pub(crate) fn take_params(url: &str, names: &[&str]) -> (String, Vec<(String, String)>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), Vec::new());
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key);
        if names.contains(&key.as_str()) {
            taken.push((key, percent_decode(value)));
        } else {
            kept.push(pair);
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, taken)
}

/// True for PostgreSQL's key-value form (`host=a,b port=5432,5433 dbname=jobs`), which has no
/// scheme: its first word is `key=value`.
pub(crate) fn is_key_value(url: &str) -> bool {
    let first = url.split_whitespace().next().unwrap_or_default();
    first.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// [`take_params`] for the key-value form: the words `name=value` named in `names` removed,
/// the rest kept as written. A quoted value (`key='a b'`) is not split: libpq's quoting is
/// left to the driver, and such a word is never one of ours.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn take_kv_params(url: &str, names: &[&str]) -> (String, Vec<(String, String)>) {
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    let mut quoted = false;
    for word in url.split(' ').filter(|w| !w.is_empty()) {
        let ours = (!quoted)
            .then(|| word.split_once('='))
            .flatten()
            .filter(|(k, v)| names.contains(k) && !v.starts_with('\''));
        match ours {
            Some((k, v)) => taken.push((k.to_string(), v.to_string())),
            None => kept.push(word),
        }
        // An odd number of quotes opens (or closes) a quoted value.
        if word.matches('\'').count() % 2 == 1 {
            quoted = !quoted;
        }
    }
    (kept.join(" "), taken)
}

/// `%XX` escapes decoded (`+` is left as it is, as the drivers read URLs); a malformed escape
/// is kept as written.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_named_params_and_keeps_the_rest_as_written() {
        let (url, taken) = take_params(
            "postgres://u@h/db?sslmode=verify-full&application_name=a%20b&sslrootcert=%2Fetc%2Fca.pem",
            &["sslmode", "sslrootcert"],
        );
        assert_eq!(url, "postgres://u@h/db?application_name=a%20b");
        assert_eq!(
            taken,
            [
                ("sslmode".to_string(), "verify-full".to_string()),
                ("sslrootcert".to_string(), "/etc/ca.pem".to_string())
            ]
        );
        let (url, taken) = take_params("mysql://u@h/db?ssl-mode=REQUIRED", &["ssl-mode"]);
        assert_eq!(url, "mysql://u@h/db");
        assert_eq!(taken, [("ssl-mode".to_string(), "REQUIRED".to_string())]);
        let (url, taken) = take_params("mysql://u@h/db", &["ssl-mode"]);
        assert_eq!(url, "mysql://u@h/db");
        assert!(taken.is_empty());
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("a+b%zz"), "a+b%zz");
    }

    #[test]
    fn key_value_form() {
        assert!(is_key_value("host=a,b port=1,2 dbname=x"));
        assert!(!is_key_value("postgres://h/db?x=1"));
        assert!(!is_key_value("sqlite::memory:"));
        let (rest, taken) = take_kv_params(
            "host=a,b sslmode=disable application_name='x pool_mode=y' pool_mode=transaction",
            &["sslmode", "pool_mode"],
        );
        assert_eq!(rest, "host=a,b application_name='x pool_mode=y'");
        assert_eq!(
            taken,
            [
                ("sslmode".to_string(), "disable".to_string()),
                ("pool_mode".to_string(), "transaction".to_string())
            ]
        );
    }
}
