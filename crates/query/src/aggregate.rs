//! Partial aggregates on the nodes. An aggregate straight over a table of Parquet objects
//! whose functions combine over parts (`count`, `sum`, `min`, `max`, `avg`; no `DISTINCT`,
//! `FILTER` or ordering) is rewritten so that every node aggregates the rows of its own row
//! groups (`proto::Request::AggregateQuery`) and the client only combines the nodes' partial rows:
//! counts and sums add up, minimums and maximums compare, an average is the sum of the sums
//! over the sum of the counts. `SELECT count(*), avg(ke) FROM t WHERE ...` then moves one row
//! per node instead of the `ke` column of every matching row.
//!
//! The rewrite keeps the plan's schema: `Aggregate(TableScan(table))` becomes
//! `Projection(Aggregate(TableScan(partial table)))`, whose columns have the original names,
//! qualifiers and types. Anything it cannot express (a grouping set, an expression the SQL
//! writer cannot write exactly, an average of decimals) leaves the plan as it was: the nodes
//! then return rows and the client aggregates them, the same answer with more bytes moved.

use std::sync::Arc;

use async_trait::async_trait;
use client::{AggregateFunction, AggregateSpec, PartialAggregate, ScanSpec};
use pushdown::datafusion::arrow::datatypes::{DataType, SchemaRef};
use pushdown::datafusion::catalog::Session;
use pushdown::datafusion::common::tree_node::{Transformed, TreeNode};
use pushdown::datafusion::common::{Column, Result as DfResult};
use pushdown::datafusion::datasource::TableProvider;
use pushdown::datafusion::datasource::{provider_as_source, source_as_provider};
use pushdown::datafusion::functions::core::expr_fn::coalesce;
use pushdown::datafusion::functions_aggregate::expr_fn::{max, min, sum};
use pushdown::datafusion::logical_expr::{
    Aggregate, Cast, Expr, ExprSchemable, LogicalPlan, Projection, TableScan, TableScanBuilder, TableType, lit,
};
use pushdown::datafusion::optimizer::optimizer::ApplyOrder;
use pushdown::datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use pushdown::datafusion::physical_plan::ExecutionPlan;

use crate::plan::{ObjectTable, filters_sql, portable_sql};

/// The optimizer rule that sends aggregates to the nodes (see the module docs).
#[derive(Debug)]
pub(crate) struct PushAggregates;

impl OptimizerRule for PushAggregates {
    fn name(&self) -> &str {
        "tessera_push_aggregates"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(aggregate) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match pushed(aggregate)? {
            Some(rewritten) => Ok(Transformed::yes(rewritten)),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// How the client combines the nodes' partial columns into one aggregate's result.
#[derive(Clone, Copy, Debug)]
enum Combine {
    /// Sum of counts (zero when no node answered a row).
    Count(usize),
    Sum(usize),
    Min(usize),
    Max(usize),
    /// Sum of sums over sum of counts.
    Avg {
        sum: usize,
        count: usize,
    },
}

/// The rewritten plan, or `None` when the aggregate must stay in the client.
fn pushed(aggregate: &Aggregate) -> DfResult<Option<LogicalPlan>> {
    let LogicalPlan::TableScan(scan) = aggregate.input.as_ref() else {
        return Ok(None);
    };
    let Some(table) = object_table(scan) else {
        return Ok(None);
    };
    // An aggregate that reads no column (`count(*)` alone) is already answered by counts:
    // the nodes send no rows at all.
    if scan.projected_schema.fields().is_empty() {
        return Ok(None);
    }
    if aggregate.schema.fields().len() != aggregate.group_expr.len() + aggregate.aggr_expr.len() {
        return Ok(None);
    }
    let Some((spec, combines)) = partial_spec(aggregate) else {
        return Ok(None);
    };
    // The plan's filters name the table's columns qualified; the nodes know them bare.
    let Some(filters) = scan.filters.iter().map(unqualified).collect::<Option<Vec<Expr>>>() else {
        return Ok(None);
    };
    let Ok(filters) = filters_sql(&filters) else {
        return Ok(None);
    };
    // Expressions the nodes could not plan stay in the client (the same engine plans both).
    let Ok(schema) = pushdown::partial_schema(table.table_schema(), &spec) else {
        return Ok(None);
    };
    let groups = spec.group_by.len();
    let scan_spec = ScanSpec { columns: Vec::new(), filters, limit: None, count_only: false };
    let partial = PartialAggregateTable { table, spec: scan_spec, aggregate: spec, schema };
    let source = provider_as_source(Arc::new(partial));
    let partial_scan = LogicalPlan::TableScan(TableScanBuilder::new(scan.table_name.clone(), source).build()?);

    let qualified = |name: String| Expr::Column(Column::new(Some(scan.table_name.clone()), name));
    let named = |name: String| Expr::Column(Column::new_unqualified(name));
    let group_by: Vec<Expr> = (0..groups).map(|i| qualified(format!("g{i}"))).collect();
    let mut finals = Vec::new();
    let mut results = Vec::with_capacity(combines.len());
    for combine in combines {
        let mut combined = |function: fn(Expr) -> Expr, column: usize| {
            let name = format!("a{}", finals.len());
            finals.push(function(qualified(format!("p{column}"))).alias(name.clone()));
            named(name)
        };
        let result = match combine {
            Combine::Count(column) => coalesce(vec![combined(sum, column), lit(0i64)]),
            Combine::Sum(column) => combined(sum, column),
            Combine::Min(column) => combined(min, column),
            Combine::Max(column) => combined(max, column),
            Combine::Avg { sum: sums, count } => {
                let sums = combined(sum, sums);
                let count = combined(sum, count);
                cast(sums, DataType::Float64) / cast(count, DataType::Float64)
            }
        };
        results.push(result);
    }
    let final_aggregate = LogicalPlan::Aggregate(Aggregate::try_new(Arc::new(partial_scan), group_by, finals)?);
    let final_schema = Arc::clone(final_aggregate.schema());
    // The original columns, in order, with their names, qualifiers and types.
    let mut projection = Vec::with_capacity(aggregate.schema.fields().len());
    let outputs = (0..groups).map(|i| qualified(format!("g{i}"))).chain(results);
    for ((qualifier, field), expr) in aggregate.schema.iter().zip(outputs) {
        let expr = if expr.get_type(final_schema.as_ref())? == *field.data_type() {
            expr
        } else {
            cast(expr, field.data_type().clone())
        };
        projection.push(expr.alias_qualified(qualifier.cloned(), field.name()));
    }
    Ok(Some(LogicalPlan::Projection(Projection::try_new(projection, Arc::new(final_aggregate))?)))
}

/// The scan's table, when it is a table of objects whose scans go to the nodes and the scan
/// has no limit of its own.
fn object_table(scan: &TableScan) -> Option<ObjectTable> {
    if scan.fetch.is_some() {
        return None;
    }
    let provider = source_as_provider(&scan.source).ok()?;
    let table = provider.downcast_ref::<ObjectTable>()?;
    table.pushes_down().then(|| table.clone())
}

/// What each node computes, and how the client combines it per aggregate; `None` when some
/// group expression or aggregate cannot go to the nodes.
fn partial_spec(aggregate: &Aggregate) -> Option<(AggregateSpec, Vec<Combine>)> {
    let input = aggregate.input.schema();
    let mut group_by = Vec::with_capacity(aggregate.group_expr.len());
    for expr in &aggregate.group_expr {
        if matches!(expr, Expr::GroupingSet(_)) || expr.is_volatile() {
            return None;
        }
        group_by.push(writable(expr)?);
    }
    let mut aggregates = Vec::new();
    let mut combines = Vec::with_capacity(aggregate.aggr_expr.len());
    let mut add = |function, argument| {
        aggregates.push(PartialAggregate { function, argument });
        aggregates.len() - 1
    };
    for expr in &aggregate.aggr_expr {
        let inner = match expr {
            Expr::Alias(alias) => alias.expr.as_ref(),
            other => other,
        };
        let Expr::AggregateFunction(function) = inner else {
            return None;
        };
        let params = &function.params;
        let [argument] = params.args.as_slice() else {
            return None;
        };
        if params.distinct
            || params.filter.is_some()
            || !params.order_by.is_empty()
            || params.null_treatment.is_some()
            || argument.is_volatile()
        {
            return None;
        }
        // `count(*)` is `count(1)`: rows, whatever their values.
        let counts_rows = matches!(argument, Expr::Literal(value, _) if !value.is_null());
        let combine = match function.func.name() {
            "count" if counts_rows => Combine::Count(add(AggregateFunction::Count, None)),
            "count" => Combine::Count(add(AggregateFunction::Count, Some(writable(argument)?))),
            "sum" => Combine::Sum(add(AggregateFunction::Sum, Some(writable(argument)?))),
            "min" => Combine::Min(add(AggregateFunction::Min, Some(writable(argument)?))),
            "max" => Combine::Max(add(AggregateFunction::Max, Some(writable(argument)?))),
            "avg" => {
                // Integers and floats average as a double; other types (decimals) have their
                // own precision rules, so they stay in the client.
                let kind = argument.get_type(input.as_ref()).ok()?;
                if !(kind.is_integer() || kind.is_floating()) {
                    return None;
                }
                let as_double = writable(&cast(argument.clone(), DataType::Float64))?;
                let sum = add(AggregateFunction::Sum, Some(as_double));
                let count = add(AggregateFunction::Count, Some(writable(argument)?));
                Combine::Avg { sum, count }
            }
            _ => return None,
        };
        combines.push(combine);
    }
    Some((AggregateSpec { group_by, aggregates }, combines))
}

/// `expr` as SQL text a node parses back over the table's own (unqualified) columns.
fn writable(expr: &Expr) -> Option<String> {
    portable_sql(&unqualified(expr)?)
}

/// `expr` with its columns named without their table.
fn unqualified(expr: &Expr) -> Option<Expr> {
    let rewritten = expr.clone().transform(|e| match e {
        Expr::Column(column) => Ok(Transformed::yes(Expr::Column(Column::new_unqualified(column.name)))),
        other => Ok(Transformed::no(other)),
    });
    rewritten.ok().map(|t| t.data)
}

fn cast(expr: Expr, to: DataType) -> Expr {
    Expr::Cast(Cast::new(Box::new(expr), to))
}

/// A table whose rows are the nodes' partial aggregates of an [`ObjectTable`]: one row per
/// group per node (and per fragment the client evaluates itself).
#[derive(Debug)]
struct PartialAggregateTable {
    table: ObjectTable,
    spec: ScanSpec,
    aggregate: AggregateSpec,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for PartialAggregateTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.table.exec(self.spec.clone(), Some(self.aggregate.clone()), Arc::clone(&self.schema), projection, limit)
    }
}
