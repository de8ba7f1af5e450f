//! `--tp N` against the model before any worker starts: each rank holds 1/N of the query
//! heads and of the MLP columns, and 1/N of the KV heads or one replicated KV head (so N
//! and the KV heads must divide one another). A worker would stop on the same rule after
//! loading; here the error names the flag, the config.json field and its value.

use std::path::Path;

/// Checks that `tp` splits the model in `dir` (its config.json) evenly.
pub fn check(dir: &Path, tp: usize) -> Result<(), String> {
    if tp == 1 {
        return Ok(());
    }
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    check_config(&config, tp)
}

fn check_config(config: &serde_json::Value, tp: usize) -> Result<(), String> {
    let field = |name: &str| config.get(name).and_then(serde_json::Value::as_u64);
    let heads = field("num_attention_heads").ok_or("config.json has no num_attention_heads")?;
    let kv_heads = field("num_key_value_heads").unwrap_or(heads);
    let tp64 = tp as u64;
    for (name, value) in [
        ("num_attention_heads", Some(heads)),
        ("intermediate_size", field("intermediate_size")),
    ] {
        if let Some(value) = value.filter(|v| !v.is_multiple_of(tp64)) {
            return Err(format!(
                "--tp {tp} must divide the model's {name} ({value}, config.json)"
            ));
        }
    }
    if !kv_heads.is_multiple_of(tp64) && !tp64.is_multiple_of(kv_heads) {
        return Err(format!(
            "--tp {tp} and the model's num_key_value_heads ({kv_heads}, config.json) must \
             divide one another"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smollm() -> serde_json::Value {
        json!({"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536})
    }

    #[test]
    fn an_even_split_passes() {
        assert!(check_config(&smollm(), 3).is_ok());
        let llama = json!({"num_attention_heads": 32, "num_key_value_heads": 8,
                           "intermediate_size": 14336});
        assert!(check_config(&llama, 16).is_ok()); // KV heads replicated
    }

    #[test]
    fn an_uneven_split_names_the_flag_and_the_field() {
        assert_eq!(
            check_config(&smollm(), 2).unwrap_err(),
            "--tp 2 must divide the model's num_attention_heads (9, config.json)"
        );
        let odd = json!({"num_attention_heads": 12, "num_key_value_heads": 4,
                         "intermediate_size": 1536});
        assert!(check_config(&odd, 6)
            .unwrap_err()
            .contains("num_key_value_heads (4, config.json)"));
    }

    #[test]
    fn tp1_reads_nothing() {
        assert!(check(Path::new("/nonexistent"), 1).is_ok());
    }
}
