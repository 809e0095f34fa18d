//! A DataFusion table over chosen row groups of Parquet objects, read through a
//! [`ByteSource`]: DataFusion's own Parquet scan (row-group statistics pruning, filters
//! evaluated while decoding) with the footers the caller already parsed.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::{DFSchema, Result};
use datafusion::datasource::TableProvider;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetAccessPlan;
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfigBuilder, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::parquet::arrow::arrow_reader::ArrowReaderOptions;
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use crate::{ByteSource, ScanObject, UNAVAILABLE_MARK};

/// The row groups of `objects`, as one table.
#[derive(Debug)]
pub(crate) struct RowGroupTable {
    schema: SchemaRef,
    objects: Arc<Vec<ScanObject>>,
    source: Arc<dyn ByteSource>,
    partitions: usize,
}

impl RowGroupTable {
    pub(crate) fn new(
        schema: SchemaRef,
        objects: Vec<ScanObject>,
        source: Arc<dyn ByteSource>,
        partitions: usize,
    ) -> Self {
        Self { schema, objects: Arc::new(objects), source, partitions: partitions.max(1) }
    }

    /// The row groups spread over at most `partitions` file groups, round robin, each object
    /// listed in a group with the access plan of its row groups there.
    fn file_groups(&self) -> Vec<FileGroup> {
        let mut plans: Vec<Vec<(usize, ParquetAccessPlan)>> = vec![Vec::new(); self.partitions];
        let mut next = 0;
        for (idx, object) in self.objects.iter().enumerate() {
            let count = object.footer.row_groups();
            for &group in &object.row_groups {
                debug_assert!(group < count, "row groups were checked against the footer");
                let slot = &mut plans[next % self.partitions];
                next += 1;
                match slot.iter_mut().find(|(i, _)| *i == idx) {
                    Some((_, plan)) => plan.scan(group),
                    None => {
                        let mut plan = ParquetAccessPlan::new_none(count);
                        plan.scan(group);
                        slot.push((idx, plan));
                    }
                }
            }
        }
        plans
            .into_iter()
            .filter(|files| !files.is_empty())
            .map(|files| {
                let files = files
                    .into_iter()
                    .map(|(idx, plan)| {
                        PartitionedFile::new(format!("o{idx}"), self.objects[idx].size).with_extension(plan)
                    })
                    .collect();
                FileGroup::new(files)
            })
            .collect()
    }
}

#[async_trait]
impl TableProvider for RowGroupTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let factory =
            Arc::new(SourceReaderFactory { objects: Arc::clone(&self.objects), source: Arc::clone(&self.source) });
        let mut source = ParquetSource::new(Arc::clone(&self.schema))
            .with_pushdown_filters(true)
            .with_reorder_filters(true)
            // See `crate::session`: the page index and bloom filters stay unread.
            .with_enable_page_index(false)
            .with_bloom_filter_on_read(false)
            .with_parquet_file_reader_factory(factory);
        if let Some(predicate) = conjunction(filters.to_vec()) {
            let df_schema = DFSchema::try_from(self.schema.as_ref().clone())?;
            source = source.with_predicate(state.create_physical_expr(predicate, &df_schema)?);
        }
        let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
            .with_file_groups(self.file_groups())
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }

    /// Filters prune row groups and pages and are applied while decoding, but DataFusion keeps
    /// its own filter above the scan too (pruning is not row-exact for every expression).
    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}

/// Makes readers that answer metadata from the parsed footers and bytes from the source.
#[derive(Debug)]
struct SourceReaderFactory {
    objects: Arc<Vec<ScanObject>>,
    source: Arc<dyn ByteSource>,
}

impl ParquetFileReaderFactory for SourceReaderFactory {
    fn create_reader(
        &self,
        _partition_index: usize,
        file: PartitionedFile,
        _metadata_size_hint: Option<usize>,
        _metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Box<dyn AsyncFileReader + Send>> {
        let location = file.object_meta.location.as_ref();
        let idx: usize = location
            .strip_prefix('o')
            .and_then(|i| i.parse().ok())
            .filter(|i| *i < self.objects.len())
            .ok_or_else(|| datafusion::error::DataFusionError::Internal(format!("unknown scan file {location}")))?;
        Ok(Box::new(SourceReader {
            idx,
            metadata: Arc::clone(&self.objects[idx].footer.metadata),
            source: Arc::clone(&self.source),
        }))
    }
}

struct SourceReader {
    idx: usize,
    metadata: Arc<ParquetMetaData>,
    source: Arc<dyn ByteSource>,
}

impl AsyncFileReader for SourceReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, datafusion::parquet::errors::Result<Bytes>> {
        self.source
            .read(self.idx, range)
            .map(|result| result.map_err(|e| ParquetError::External(format!("{UNAVAILABLE_MARK} {e}").into())))
            .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, datafusion::parquet::errors::Result<Arc<ParquetMetaData>>> {
        let metadata = Arc::clone(&self.metadata);
        async move { Ok(metadata) }.boxed()
    }
}
