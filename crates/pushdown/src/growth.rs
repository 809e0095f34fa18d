//! A bound on how much larger an expression's values may be than the values they are computed
//! from. DataFusion's memory pool accounts for what operators hold (sorts, joins, aggregates),
//! not for the arrays expressions produce: `repeat(s, 1000000000)` or `lpad(s, 2000000000)`
//! would allocate gigabytes for one batch and take the process (a storage node, the gateway)
//! down, since an allocation failure aborts. So every plan is checked before it runs: the
//! functions whose result size a number chooses (`repeat`, `lpad`, `rpad`, `replace`) take that
//! number as a literal within bounds, and nested, their growth multiplies and is bounded too.
//! Everything else grows a value at most by what the SQL text adds (concatenations, literals),
//! and the SQL text is bounded by the request that carries it.

use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::Error;

/// How many times the size of its inputs an expression's value may be, at most.
pub const VALUE_GROWTH_MAX: u64 = 64;
/// Characters `lpad` and `rpad` may pad a value to, at most.
pub const PAD_CHARS_MAX: i64 = 4096;

/// Checks every expression of `plan` (and of its subqueries) against the bounds above.
pub fn check_plan(plan: &LogicalPlan) -> Result<(), Error> {
    let mut refused = None;
    let walked = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| match growth(expr) {
            Ok(_) => Ok(TreeNodeRecursion::Continue),
            Err(reason) => {
                refused = Some(reason);
                Ok(TreeNodeRecursion::Stop)
            }
        })
    });
    walked.map_err(Error::from_datafusion)?;
    match refused {
        Some(reason) => Err(Error::BadQuery(reason)),
        None => Ok(()),
    }
}

/// Checks one expression against the bounds above.
pub fn check_expr(expr: &Expr) -> Result<(), Error> {
    growth(expr).map(|_| ()).map_err(Error::BadQuery)
}

/// How many times larger than its inputs `expr`'s values may be (sums through concatenation
/// are not counted: they add at most what the SQL names), or why it is not bounded.
fn growth(expr: &Expr) -> Result<u64, String> {
    let mut children = Vec::new();
    expr.apply_children(|child| {
        children.push(child);
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    let mut most = 1u64;
    for child in &children {
        most = most.max(growth(child)?);
    }
    // Anything but these functions (`||` and concat() included) grows a value by no more
    // than its largest input plus what the SQL adds.
    let Expr::ScalarFunction(call) = expr else {
        return Ok(most);
    };
    let name = call.func.name().to_ascii_lowercase();
    let grown = match name.as_str() {
        "repeat" => {
            let count = call.args.get(1).and_then(literal_int).ok_or_else(|| {
                "repeat's count must be a literal number (its result's size must be known before it runs)".to_owned()
            })?;
            most.saturating_mul(count.max(0) as u64)
        }
        "lpad" | "rpad" => {
            let length = call.args.get(1).and_then(literal_int).ok_or_else(|| {
                format!("{name}'s length must be a literal number (its result's size must be known before it runs)")
            })?;
            if length > PAD_CHARS_MAX {
                return Err(format!("{name} pads to at most {PAD_CHARS_MAX} characters here, not {length}"));
            }
            most
        }
        "replace" => {
            let to = call.args.get(2).and_then(literal_text).ok_or_else(|| {
                "replace's replacement must be a literal string (its result's size must be known before it runs)"
                    .to_owned()
            })?;
            // Every byte (and the empty string between two) may become the replacement.
            most.saturating_mul(to.len() as u64 + 1)
        }
        _ => most,
    };
    if grown > VALUE_GROWTH_MAX {
        return Err(format!(
            "{expr} can make a value {grown} times the size of its inputs: at most {VALUE_GROWTH_MAX} here, \
             so that results stay within memory"
        ));
    }
    Ok(grown)
}

/// The integer `expr` is, if it is a literal (or a cast of one).
fn literal_int(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Literal(value, _) => match value.cast_to(&datafusion::arrow::datatypes::DataType::Int64).ok()? {
            ScalarValue::Int64(Some(n)) => Some(n),
            _ => None,
        },
        Expr::Cast(cast) => literal_int(&cast.expr),
        Expr::TryCast(cast) => literal_int(&cast.expr),
        Expr::Alias(alias) => literal_int(&alias.expr),
        _ => None,
    }
}

/// The text `expr` is, if it is a string literal (or a cast of one).
fn literal_text(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Literal(value, _) if !value.is_null() => match value {
            ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => {
                Some(s.clone())
            }
            _ => None,
        },
        Expr::Cast(cast) => literal_text(&cast.expr),
        Expr::TryCast(cast) => literal_text(&cast.expr),
        Expr::Alias(alias) => literal_text(&alias.expr),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn planned(sql: &str) -> LogicalPlan {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.sql("CREATE TABLE t (s VARCHAR, n BIGINT) AS VALUES ('a', 1)").await.unwrap();
        ctx.state().create_logical_plan(sql).await.unwrap()
    }

    #[tokio::test]
    async fn bounded_expressions_pass() {
        for sql in [
            "SELECT s, upper(s) || 'x', concat(s, s, s) FROM t WHERE s LIKE 'a%'",
            "SELECT repeat(s, 8), lpad(s, 100), rpad(s, 10, '-'), replace(s, 'a', 'bb') FROM t",
            "SELECT repeat(repeat(s, 8), 8) FROM t",
            "SELECT count(*) FROM t WHERE repeat(s, 2) = 'aa'",
            "SELECT s FROM t WHERE n IN (SELECT length(repeat(s, 3)) FROM t)",
        ] {
            check_plan(&planned(sql).await).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    #[tokio::test]
    async fn unbounded_expressions_are_refused_with_the_reason() {
        for (sql, reason) in [
            ("SELECT repeat(s, 1000000000) FROM t", "1000000000 times"),
            ("SELECT repeat(s, n) FROM t", "repeat's count must be a literal"),
            ("SELECT lpad(s, 2000000000) FROM t", "at most 4096 characters"),
            ("SELECT rpad(s, n) FROM t", "rpad's length must be a literal"),
            ("SELECT replace(s, '', s) FROM t", "replacement must be a literal"),
            ("SELECT replace(s, 'a', repeat('x', 60)) FROM t", "replacement must be a literal"),
            ("SELECT repeat(repeat(s, 16), 16) FROM t", "256 times"),
            ("SELECT count(*) FROM t WHERE length(repeat(s, 100)) > 1", "100 times"),
            ("SELECT s FROM t WHERE n IN (SELECT length(repeat(s, 99)) FROM t)", "99 times"),
        ] {
            let error = check_plan(&planned(sql).await).expect_err(sql).to_string();
            assert!(error.contains(reason), "{sql}: {error}");
        }
    }
}
