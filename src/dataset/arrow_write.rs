//! Writing Arrow IPC files (`meshfeed gen --format arrow`).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_buffer::Buffer;
use arrow_schema::{DataType, Schema};

use super::schema::{DType, Field, FieldKind};
use crate::error::{Error, ErrorKind, Result, ResultExt};

/// Writes an Arrow IPC file of `samples` samples in record batches of `batch_rows` rows.
pub fn write(
    path: &Path,
    fields: &[Field],
    samples: u64,
    batch_rows: u64,
    mut value: impl FnMut(u64, usize, &mut Vec<u8>),
) -> Result<()> {
    use arrow_array::builder::{BinaryBuilder, StringBuilder};
    use arrow_array::{make_array, ArrayRef, RecordBatch};
    use arrow_schema::Field as AField;

    fn data_type(kind: &FieldKind) -> DataType {
        match kind {
            FieldKind::Bytes { utf8: false, elem: None } => DataType::Binary,
            FieldKind::Bytes { utf8: true, elem: None } => DataType::Utf8,
            // Refused below.
            FieldKind::Bytes { elem: Some(_), .. } => DataType::Binary,
            FieldKind::Tensor { dtype, shape } => {
                let mut dt = match dtype {
                    DType::Bool | DType::U8 => DataType::UInt8,
                    DType::I8 => DataType::Int8,
                    DType::U16 => DataType::UInt16,
                    DType::I16 => DataType::Int16,
                    DType::U32 => DataType::UInt32,
                    DType::I32 => DataType::Int32,
                    DType::U64 => DataType::UInt64,
                    DType::I64 => DataType::Int64,
                    DType::F16 => DataType::Float16,
                    DType::F32 => DataType::Float32,
                    DType::F64 => DataType::Float64,
                };
                for &n in shape.iter().rev() {
                    dt = DataType::FixedSizeList(Arc::new(AField::new("item", dt, false)), n as i32);
                }
                dt
            }
        }
    }
    if let Some(f) = fields.iter().find(|f| matches!(f.kind, FieldKind::Bytes { elem: Some(_), .. })) {
        return Err(Error::Config(format!("Arrow output does not write list field '{}'", f.name)));
    }
    if let Some(f) = fields.iter().find(|f| matches!(f.kind, FieldKind::Tensor { dtype: DType::Bool, .. })) {
        return Err(Error::Config(format!("Arrow output does not support bool field '{}' (use u8)", f.name)));
    }
    let schema = Arc::new(Schema::new(
        fields.iter().map(|f| AField::new(f.name.clone(), data_type(&f.kind), false)).collect::<Vec<_>>(),
    ));
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut writer = arrow_ipc::writer::FileWriter::try_new(std::io::BufWriter::new(file), &schema).in_file(path)?;
    let mut start = 0;
    let mut scratch = Vec::new();
    while start < samples {
        let end = (start + batch_rows.max(1)).min(samples);
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (fi, f) in fields.iter().enumerate() {
            let col: ArrayRef = match &f.kind {
                FieldKind::Bytes { utf8, .. } => {
                    let mut values = Vec::new();
                    for id in start..end {
                        scratch.clear();
                        value(id, fi, &mut scratch);
                        values.push(scratch.clone());
                    }
                    if *utf8 {
                        let mut b = StringBuilder::new();
                        for v in values {
                            let text =
                                String::from_utf8(v).map_err(|e| Error::caused(ErrorKind::Config, e.to_string(), e))?;
                            b.append_value(text);
                        }
                        Arc::new(b.finish())
                    } else {
                        let mut b = BinaryBuilder::new();
                        for v in values {
                            b.append_value(v);
                        }
                        Arc::new(b.finish())
                    }
                }
                FieldKind::Tensor { .. } => {
                    let mut bytes = Vec::new();
                    for id in start..end {
                        value(id, fi, &mut bytes);
                    }
                    // Build the nested fixed-size lists bottom-up around one values buffer.
                    let mut levels = vec![data_type(&f.kind)];
                    while let DataType::FixedSizeList(child, _) = levels.last().expect("non-empty").clone() {
                        levels.push(child.data_type().clone());
                    }
                    let leaf = levels.pop().expect("leaf type");
                    let mut len = bytes.len() / DType::of_arrow(&leaf).expect("primitive leaf").size();
                    let mut data = arrow_data::ArrayData::builder(leaf)
                        .len(len)
                        .add_buffer(Buffer::from_vec(bytes))
                        .build()
                        .in_file(path)?;
                    for dt in levels.into_iter().rev() {
                        let DataType::FixedSizeList(_, n) = dt else { unreachable!("list level") };
                        len /= n as usize;
                        data =
                            arrow_data::ArrayData::builder(dt).len(len).add_child_data(data).build().in_file(path)?;
                    }
                    make_array(data)
                }
            };
            columns.push(col);
        }
        let batch = RecordBatch::try_new(schema.clone(), columns).in_file(path)?;
        writer.write(&batch).in_file(path)?;
        start = end;
    }
    writer.finish().in_file(path)
}
