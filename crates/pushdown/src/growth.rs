//! A bound on how much larger an expression's values may be than the values they are computed
//! from. DataFusion's memory pool accounts for what operators hold (sorts, joins, aggregates),
//! not for the arrays expressions produce: `repeat(s, 1000000000)` or `lpad(s, 2000000000)`
//! would allocate gigabytes for one batch and take the process (a storage node, the gateway)
//! down, since an allocation failure aborts. So every plan is checked before it runs.
//!
//! The check is plan-wide and conservative: every function that makes a value larger than its
//! inputs multiplies one growth factor for the whole plan (its subqueries, CTEs and derived
//! tables included, so growth cannot be carried through a column of an inner query):
//! `repeat(s, n)` by n, `replace(s, from, to)` by the replacement's length plus one, `concat`
//! and `||` by the number of non-literal values they join. Counts and replacements must be
//! literals, and the factor at most [`VALUE_GROWTH_MAX`]; `lpad`/`rpad` pad to at most
//! [`PAD_CHARS_MAX`] characters. Every other function grows a value by at most a constant the
//! SQL text names (which its request bounds); `regexp_replace` grows by twice its literal
//! replacement's length plus one (group references repeat the match). The engine is built
//! without DataFusion's array functions (`array_repeat`, `range`, ...), which a test checks
//! stay unknown.

use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator};

use crate::Error;

/// The growth factor of a whole plan, at most.
pub const VALUE_GROWTH_MAX: u64 = 64;
/// Characters `lpad` and `rpad` may pad a value to, at most.
pub const PAD_CHARS_MAX: i64 = 4096;

/// Checks every expression of `plan` (and of its subqueries) against the bounds above.
pub fn check_plan(plan: &LogicalPlan) -> Result<(), Error> {
    let mut growth = Growth { factor: 1, refused: None };
    let walked = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            growth.walk(expr);
            Ok(if growth.refused.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        })
    });
    walked.map_err(Error::from_datafusion)?;
    match growth.refused {
        Some(reason) => Err(Error::BadQuery(reason)),
        None => Ok(()),
    }
}

/// The growth factor so far, or why the plan is refused.
struct Growth {
    factor: u64,
    refused: Option<String>,
}

impl Growth {
    fn refuse(&mut self, reason: String) {
        self.refused.get_or_insert(reason);
    }

    /// Multiplies the factor by `by` for `expr`, refusing past the bound.
    fn grow(&mut self, expr: &Expr, by: u64) {
        self.factor = self.factor.saturating_mul(by.max(1));
        if self.factor > VALUE_GROWTH_MAX {
            self.refuse(format!(
                "{expr} can make values {} times the size of its inputs (with the rest of the query): \
                 at most {VALUE_GROWTH_MAX} here, so that results stay within memory",
                self.factor
            ));
        }
    }

    fn walk(&mut self, expr: &Expr) {
        if self.refused.is_some() {
            return;
        }
        match expr {
            Expr::BinaryExpr(BinaryExpr { op: Operator::StringConcat, .. }) => {
                // One chain `a || b || c` joins its operands once.
                let mut operands = Vec::new();
                concat_operands(expr, &mut operands);
                let values = operands.iter().filter(|e| !matches!(e, Expr::Literal(..))).count();
                self.grow(expr, values as u64);
                for operand in operands {
                    self.walk(operand);
                }
                return;
            }
            Expr::ScalarFunction(call) => {
                let name = call.func.name().to_ascii_lowercase();
                match name.as_str() {
                    "repeat" => match call.args.get(1).and_then(literal_int) {
                        Some(count) => self.grow(expr, count.max(0) as u64),
                        None => self.refuse(
                            "repeat's count must be a literal number (its result's size must be known before it runs)"
                                .into(),
                        ),
                    },
                    "lpad" | "rpad" => match call.args.get(1).and_then(literal_int) {
                        Some(length) if length > PAD_CHARS_MAX => {
                            self.refuse(format!("{name} pads to at most {PAD_CHARS_MAX} characters here, not {length}"))
                        }
                        Some(_) => {}
                        None => self.refuse(format!(
                            "{name}'s length must be a literal number (its result's size must be known before it runs)"
                        )),
                    },
                    "replace" => match call.args.get(2).and_then(literal_text) {
                        // Every byte (and the empty string between two) may become the replacement.
                        Some(to) => self.grow(expr, to.len() as u64 + 1),
                        None => self.refuse(
                            "replace's replacement must be a literal string (its result's size must be known before it runs)"
                                .into(),
                        ),
                    },
                    // Each match becomes the replacement, whose group references (`\\1`)
                    // each repeat at most the match.
                    "regexp_replace" => match call.args.get(2).and_then(literal_text) {
                        Some(to) => self.grow(expr, 2 * to.len() as u64 + 1),
                        None => self.refuse(
                            "regexp_replace's replacement must be a literal string (its result's size must be known \
                             before it runs)"
                                .into(),
                        ),
                    },
                    "concat" | "concat_ws" => {
                        let values = call.args.iter().filter(|e| !matches!(e, Expr::Literal(..))).count();
                        self.grow(expr, values as u64);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        let _ = expr.apply_children(|child| {
            self.walk(child);
            Ok(if self.refused.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        });
    }
}

/// The operands of the `||` chain `expr`, left to right.
fn concat_operands<'a>(expr: &'a Expr, out: &mut Vec<&'a Expr>) {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::StringConcat, right }) => {
            concat_operands(left, out);
            concat_operands(right, out);
        }
        other => out.push(other),
    }
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
            "SELECT repeat(s, 8), lpad(s, 100), rpad(s, 10, '-') FROM t",
            "SELECT repeat(repeat(s, 8), 8) FROM t",
            "SELECT count(*) FROM t WHERE repeat(s, 2) = 'aa'",
            "SELECT s FROM t WHERE n IN (SELECT length(repeat(s, 3)) FROM t)",
            "SELECT s || ',' || s || ',' || s || ',' || s FROM t",
            "SELECT replace(s, ',', ''), regexp_replace(s, '[0-9]+', '#') FROM t",
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
            // Concatenations add up; so does growth carried through an inner query's column.
            ("SELECT concat(repeat(s, 60), repeat(s, 60)) FROM t", "times the size"),
            ("SELECT repeat(s, 60) || repeat(s, 60) FROM t", "times the size"),
            ("SELECT regexp_replace(s, '.', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', 'g') FROM t", "67 times"),
            ("SELECT regexp_replace(s, '.', s) FROM t", "replacement must be a literal"),
            ("SELECT repeat(r, 60) FROM (SELECT repeat(s, 60) AS r FROM t)", "times the size"),
            ("WITH a AS (SELECT repeat(s, 9) AS r FROM t) SELECT repeat(r, 9) FROM a", "81 times"),
            ("SELECT repeat((SELECT max(repeat(s, 60)) FROM t), 60) FROM t", "times the size"),
        ] {
            let error = check_plan(&planned(sql).await).expect_err(sql).to_string();
            assert!(error.contains(reason), "{sql}: {error}");
        }
    }

    #[tokio::test]
    async fn functions_the_bound_does_not_know_are_not_built_in() {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.sql("CREATE TABLE t (s VARCHAR, n BIGINT) AS VALUES ('a', 1)").await.unwrap();
        for sql in [
            "SELECT array_repeat(s, 1000000) FROM t",
            "SELECT array_resize(make_array(s), 1000000) FROM t",
            "SELECT range(0, 3000000000) FROM t",
            "SELECT generate_series(0, 3000000000) FROM t",
        ] {
            assert!(ctx.state().create_logical_plan(sql).await.is_err(), "{sql} is built in: bound it");
        }
    }
}
