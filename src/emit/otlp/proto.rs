//! The OTLP profiles messages sampler writes, with their field numbers: opentelemetry-proto's
//! `opentelemetry/proto/profiles/v1development/profiles.proto`,
//! `collector/profiles/v1development/profiles_service.proto`, `common/v1/common.proto`
//! and `resource/v1/resource.proto`, as of release 1.10 (1.11 changed comments only):
//! the wire format that the OpenTelemetry Collector's OTLP receiver (pdata 1.71) decodes.
//! Written out by hand for prost to encode; fields sampler never sets are left out, which
//! protobuf allows (an absent field is its zero value).

use prost::Message;

/// What an OTLP exporter sends: every resource's profiles and the one dictionary their
/// indexes point into.
#[derive(Clone, PartialEq, Message)]
pub struct ExportProfilesServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<ProfilesDictionary>,
}

/// The tables that profiles refer into by index. Entry 0 of every table is its zero
/// value, which index 0 means ("none").
#[derive(Clone, PartialEq, Message)]
pub struct ProfilesDictionary {
    #[prost(message, repeated, tag = "1")]
    pub mapping_table: Vec<Mapping>,
    #[prost(message, repeated, tag = "2")]
    pub location_table: Vec<Location>,
    #[prost(message, repeated, tag = "3")]
    pub function_table: Vec<Function>,
    #[prost(message, repeated, tag = "4")]
    pub link_table: Vec<Link>,
    #[prost(string, repeated, tag = "5")]
    pub string_table: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    #[prost(message, repeated, tag = "7")]
    pub stack_table: Vec<Stack>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceProfiles {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_profiles: Vec<ScopeProfiles>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeProfiles {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<Profile>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

/// One kind of value (CPU time, off-CPU time) of one resource's samples.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, optional, tag = "1")]
    pub sample_type: Option<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    #[prost(uint64, tag = "4")]
    pub duration_nano: u64,
    #[prost(message, optional, tag = "5")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "6")]
    pub period: i64,
    #[prost(int32, repeated, tag = "11")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Link {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Message)]
pub struct ValueType {
    #[prost(int32, tag = "1")]
    pub type_strindex: i32,
    #[prost(int32, tag = "2")]
    pub unit_strindex: i32,
}

/// A stack with attributes, and its observations: `values[i]` was seen at
/// `timestamps_unix_nano[i]`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(int32, tag = "1")]
    pub stack_index: i32,
    #[prost(int32, repeated, tag = "2")]
    pub attribute_indices: Vec<i32>,
    #[prost(int32, tag = "3")]
    pub link_index: i32,
    #[prost(int64, repeated, tag = "4")]
    pub values: Vec<i64>,
    #[prost(fixed64, repeated, tag = "5")]
    pub timestamps_unix_nano: Vec<u64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub memory_start: u64,
    #[prost(uint64, tag = "2")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    #[prost(int32, tag = "4")]
    pub filename_strindex: i32,
    #[prost(int32, repeated, tag = "5")]
    pub attribute_indices: Vec<i32>,
}

/// Locations, leaf first.
#[derive(Clone, PartialEq, Message)]
pub struct Stack {
    #[prost(int32, repeated, tag = "1")]
    pub location_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(int32, tag = "1")]
    pub mapping_index: i32,
    #[prost(uint64, tag = "2")]
    pub address: u64,
    /// Innermost inlined call first; the last is the function the code belongs to.
    #[prost(message, repeated, tag = "3")]
    pub lines: Vec<Line>,
    #[prost(int32, repeated, tag = "4")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(int32, tag = "1")]
    pub function_index: i32,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(int32, tag = "1")]
    pub name_strindex: i32,
    #[prost(int32, tag = "2")]
    pub system_name_strindex: i32,
    #[prost(int32, tag = "3")]
    pub filename_strindex: i32,
    #[prost(int64, tag = "4")]
    pub start_line: i64,
}

/// An entry of the dictionary's attribute table (its key is a string index).
#[derive(Clone, PartialEq, Message)]
pub struct KeyValueAndUnit {
    #[prost(int32, tag = "1")]
    pub key_strindex: i32,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
    #[prost(int32, tag = "3")]
    pub unit_strindex: i32,
}

/// A resource attribute.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 3")]
    pub value: Option<Value>,
}

/// The kinds of attribute value sampler writes: `string_value` and `int_value`.
#[derive(Clone, PartialEq, Eq, Hash, prost::Oneof)]
pub enum Value {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(int64, tag = "3")]
    Int(i64),
}
