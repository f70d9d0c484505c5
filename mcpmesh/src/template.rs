//! `${VAR}` templates in config values (header values of `url` services), filled in from
//! the environment.

/// Replaces each `${VAR}` in `template` with `lookup(VAR)`; `$$` is a literal `$`.
pub fn expand(template: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| "an unclosed ${…}".to_owned())?;
            let var = &body[..end];
            if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("${{{var}}} is not a variable name"));
            }
            let value = lookup(var).ok_or_else(|| format!("the variable {var} is not set"))?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_take_variables_and_refuse_unset_ones() {
        let env = |v: &str| (v == "TOKEN").then(|| "s3cret".to_owned());
        assert_eq!(expand("Bearer ${TOKEN}", env).unwrap(), "Bearer s3cret");
        assert_eq!(expand("a$$b $x", env).unwrap(), "a$b $x");
        assert!(expand("${MISSING}", env).unwrap_err().contains("MISSING"));
        assert!(expand("${TOKEN", env).is_err());
        assert!(expand("${A-B}", env).is_err());
    }
}
