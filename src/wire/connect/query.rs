//! The part of Spark Connect's query and type trees (`relations.proto`, `expressions.proto`,
//! `types.proto`) that tether interprets: `Relation` with `range`, `limit` and `aggregate`,
//! the expressions of `count(lit(1))`, and `DataType` for schemas (connect §1.24–§1.36).
//!
//! Everything else in these trees stays opaque: a [`Plan`](super::Plan) carries its root
//! `Relation` as bytes, and a server decodes it with [`Relation::decode`](prost::Message)
//! only when it means to interpret it. A `Relation` whose `rel_type` is a branch not modelled
//! here (`project`, `sql`, `local_relation`, …) decodes with [`Relation::rel_type`] `None`,
//! as protobuf skips unknown fields; a server answers it as an unsupported plan.

/// `spark.connect.Relation`: one node of a query plan (connect §1.24). Only the branches
/// listed in [`relation::RelType`] are modelled.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Relation {
    /// Field 1: the plan id and source information shared by every relation.
    #[prost(message, optional, tag = "1")]
    pub common: Option<RelationCommon>,
    /// The `rel_type` oneof; `None` when unset or set to a branch not modelled here.
    #[prost(oneof = "relation::RelType", tags = "8, 9, 15")]
    pub rel_type: Option<relation::RelType>,
}

impl Relation {
    /// `spark.range(start, end, step)` (connect §1.26), without a partition count: the
    /// relation a client sends for it.
    pub fn range(start: i64, end: i64, step: i64) -> Self {
        Self {
            common: None,
            rel_type: Some(relation::RelType::Range(Range {
                start: Some(start),
                end,
                step,
                num_partitions: None,
            })),
        }
    }

    /// `input.limit(n)` (connect §1.27).
    pub fn limit(input: Self, n: i32) -> Self {
        Self {
            common: None,
            rel_type: Some(relation::RelType::Limit(Box::new(Limit {
                input: Some(Box::new(input)),
                limit: n,
            }))),
        }
    }

    /// `input.count()` as PySpark sends it: a global `GROUPBY` aggregate of
    /// [`Expression::count_of_one`] (connect §1.28, §3).
    pub fn count(input: Self) -> Self {
        Self {
            common: None,
            rel_type: Some(relation::RelType::Aggregate(Box::new(Aggregate {
                input: Some(Box::new(input)),
                group_type: aggregate::GroupType::Groupby as i32,
                grouping_expressions: vec![],
                aggregate_expressions: vec![Expression::count_of_one()],
            }))),
        }
    }
}

/// Oneof and nested types of [`Relation`].
pub mod relation {
    /// The modelled branches of [`Relation::rel_type`](super::Relation::rel_type)
    /// (connect §1.24).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum RelType {
        /// Field 8: the first `limit` rows of the input (`df.limit(n)`).
        #[prost(message, tag = "8", boxed)]
        Limit(::prost::alloc::boxed::Box<super::Limit>),
        /// Field 9: an aggregation (`df.count()` sends `count(lit(1))` over the input,
        /// connect §3).
        #[prost(message, tag = "9", boxed)]
        Aggregate(::prost::alloc::boxed::Box<super::Aggregate>),
        /// Field 15: `spark.range(start, end, step)`.
        #[prost(message, tag = "15")]
        Range(super::Range),
    }
}

/// `spark.connect.RelationCommon` (connect §1.25).
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct RelationCommon {
    /// Field 1: where the relation was built (client call site); informational.
    #[prost(string, tag = "1")]
    pub source_info: String,
    /// Field 2: the client's id of this plan node.
    #[prost(int64, optional, tag = "2")]
    pub plan_id: Option<i64>,
}

/// `spark.connect.Range`: the integers `start, start + step, …` below `end`, in one
/// `bigint` column named `id` (connect §1.26; Spark's `SparkSession.range`).
#[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
pub struct Range {
    /// Field 1: the first value; unset means 0.
    #[prost(int64, optional, tag = "1")]
    pub start: Option<i64>,
    /// Field 2: the exclusive end.
    #[prost(int64, tag = "2")]
    pub end: i64,
    /// Field 3: the increment; Spark rejects 0.
    #[prost(int64, tag = "3")]
    pub step: i64,
    /// Field 4: the number of partitions the client asked for, if any.
    #[prost(int32, optional, tag = "4")]
    pub num_partitions: Option<i32>,
}

impl Range {
    /// The number of rows this range yields (Spark's `Range.numElements`, connect §1.26): `ceil((end - start) / step)` when the range
    /// moves towards `end`, else 0. Computed in 128-bit arithmetic, so extreme bounds do not
    /// overflow; `None` when `step` is 0 (an invalid range).
    pub fn row_count(&self) -> Option<u64> {
        let start = i128::from(self.start.unwrap_or(0));
        let (end, step) = (i128::from(self.end), i128::from(self.step));
        if step == 0 {
            return None;
        }
        let span = end - start;
        if span == 0 || (span > 0) != (step > 0) {
            return Some(0);
        }
        let (span, step) = (span.abs(), step.abs());
        u64::try_from((span + step - 1) / step).ok()
    }
}

/// `spark.connect.Limit`: the first `limit` rows of `input` (connect §1.27).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Limit {
    /// Field 1: the relation to limit.
    #[prost(message, optional, boxed, tag = "1")]
    pub input: Option<::prost::alloc::boxed::Box<Relation>>,
    /// Field 2: the number of rows to keep.
    #[prost(int32, tag = "2")]
    pub limit: i32,
}

/// `spark.connect.Aggregate` (connect §1.28). `df.count()` sends a `GROUPBY` aggregate
/// with no grouping expressions and one aggregate expression, `count(lit(1))`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Aggregate {
    /// Field 1: the relation to aggregate.
    #[prost(message, optional, boxed, tag = "1")]
    pub input: Option<::prost::alloc::boxed::Box<Relation>>,
    /// Field 2: the grouping kind, an [`aggregate::GroupType`] value.
    #[prost(enumeration = "aggregate::GroupType", tag = "2")]
    pub group_type: i32,
    /// Field 3: the grouping expressions (empty for a global aggregate).
    #[prost(message, repeated, tag = "3")]
    pub grouping_expressions: Vec<Expression>,
    /// Field 4: the aggregate expressions.
    #[prost(message, repeated, tag = "4")]
    pub aggregate_expressions: Vec<Expression>,
}

/// Nested types of [`Aggregate`].
pub mod aggregate {
    /// `spark.connect.Aggregate.GroupType` (connect §1.28; Spark's
    /// `relations.proto` enum of the same name).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum GroupType {
        /// Proto3 zero value: not set.
        Unspecified = 0,
        /// `GROUP BY` (and a global aggregate without grouping expressions).
        Groupby = 1,
        /// `ROLLUP`.
        Rollup = 2,
        /// `CUBE`.
        Cube = 3,
        /// `PIVOT`.
        Pivot = 4,
        /// `GROUPING SETS`.
        GroupingSets = 5,
    }
}

/// `spark.connect.Expression` (connect §1.29). Only the branches in
/// [`expression::ExprType`] are modelled.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Expression {
    /// The `expr_type` oneof; `None` when unset or set to a branch not modelled here.
    #[prost(oneof = "expression::ExprType", tags = "1, 3, 6")]
    pub expr_type: Option<expression::ExprType>,
}

/// Oneof and nested types of [`Expression`].
pub mod expression {
    /// The modelled branches of [`Expression::expr_type`](super::Expression::expr_type)
    /// (connect §1.29).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum ExprType {
        /// Field 1: a constant.
        #[prost(message, tag = "1")]
        Literal(Literal),
        /// Field 3: a function call by name, such as `count`.
        #[prost(message, tag = "3")]
        UnresolvedFunction(UnresolvedFunction),
        /// Field 6: an expression with a name (`expr AS name`).
        #[prost(message, tag = "6", boxed)]
        Alias(::prost::alloc::boxed::Box<Alias>),
    }

    /// `spark.connect.Expression.Literal` (connect §1.30). Only the branches in
    /// [`literal::LiteralType`] are modelled.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Literal {
        /// The `literal_type` oneof.
        #[prost(oneof = "literal::LiteralType", tags = "1, 3, 6, 7, 11, 13")]
        pub literal_type: Option<literal::LiteralType>,
    }

    /// Oneof types of [`Literal`].
    pub mod literal {
        /// The modelled branches of [`Literal::literal_type`](super::Literal::literal_type)
        /// (connect §1.30).
        #[derive(Clone, PartialEq, ::prost::Oneof)]
        pub enum LiteralType {
            /// Field 1: a typed `NULL`.
            #[prost(message, tag = "1")]
            Null(crate::wire::connect::DataType),
            /// Field 3: a boolean.
            #[prost(bool, tag = "3")]
            Boolean(bool),
            /// Field 6: a 32-bit integer (`lit(1)` from Python).
            #[prost(int32, tag = "6")]
            Integer(i32),
            /// Field 7: a 64-bit integer.
            #[prost(int64, tag = "7")]
            Long(i64),
            /// Field 11: a double.
            #[prost(double, tag = "11")]
            Double(f64),
            /// Field 13: a string.
            #[prost(string, tag = "13")]
            String(::prost::alloc::string::String),
        }
    }

    /// `spark.connect.Expression.UnresolvedFunction`: a call by name (connect §1.31).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct UnresolvedFunction {
        /// Field 1: the function's name, e.g. `count`.
        #[prost(string, tag = "1")]
        pub function_name: ::prost::alloc::string::String,
        /// Field 2: the arguments.
        #[prost(message, repeated, tag = "2")]
        pub arguments: Vec<super::Expression>,
        /// Field 3: `DISTINCT`.
        #[prost(bool, tag = "3")]
        pub is_distinct: bool,
        /// Field 4: whether the function is a user-defined one.
        #[prost(bool, tag = "4")]
        pub is_user_defined_function: bool,
        /// Field 5: whether the function is internal to Spark.
        #[prost(bool, optional, tag = "5")]
        pub is_internal: Option<bool>,
    }

    /// `spark.connect.Expression.Alias` (connect §1.32).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Alias {
        /// Field 1: the aliased expression.
        #[prost(message, optional, boxed, tag = "1")]
        pub expr: Option<::prost::alloc::boxed::Box<super::Expression>>,
        /// Field 2: the name (several parts for a multi-column alias).
        #[prost(string, repeated, tag = "2")]
        pub name: Vec<::prost::alloc::string::String>,
        /// Field 3: column metadata as JSON.
        #[prost(string, optional, tag = "3")]
        pub metadata: Option<::prost::alloc::string::String>,
    }
}

impl Expression {
    /// `count(lit(1))`: the unresolved function `count` of the integer literal 1, what
    /// `df.count()` sends (connect §1.29–§1.31, §3).
    pub fn count_of_one() -> Self {
        Self {
            expr_type: Some(expression::ExprType::UnresolvedFunction(
                expression::UnresolvedFunction {
                    function_name: "count".into(),
                    arguments: vec![Self {
                        expr_type: Some(expression::ExprType::Literal(expression::Literal {
                            literal_type: Some(expression::literal::LiteralType::Integer(1)),
                        })),
                    }],
                    ..Default::default()
                },
            )),
        }
    }

    /// Whether this is `count(lit(1))`, or `count(1)` with a long literal: what `df.count()`
    /// sends (connect §3), possibly under an alias.
    pub fn is_count_of_one(&self) -> bool {
        use expression::literal::LiteralType;
        match &self.expr_type {
            Some(expression::ExprType::Alias(alias)) => {
                alias.expr.as_deref().is_some_and(Self::is_count_of_one)
            }
            Some(expression::ExprType::UnresolvedFunction(f)) => {
                f.function_name.eq_ignore_ascii_case("count")
                    && !f.is_distinct
                    && matches!(
                        f.arguments.as_slice(),
                        [Self {
                            expr_type: Some(expression::ExprType::Literal(expression::Literal {
                                literal_type: Some(LiteralType::Integer(1) | LiteralType::Long(1)),
                            })),
                        }]
                    )
            }
            _ => false,
        }
    }
}

/// `spark.connect.DataType`: the type of a value or of a whole row (connect §1.33). Only
/// the kinds in [`data_type::Kind`] are modelled; `AnalyzePlan`'s `schema` answers with a
/// [`data_type::Kind::Struct`] of the result's columns.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct DataType {
    /// The `kind` oneof.
    #[prost(oneof = "data_type::Kind", tags = "1, 3, 6, 7, 9, 11, 21")]
    pub kind: Option<data_type::Kind>,
}

/// Oneof and nested types of [`DataType`].
pub mod data_type {
    /// A primitive kind: only its type variation (connect §1.36; every primitive kind of
    /// `types.proto` has `type_variation_reference` as field 1).
    #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
    pub struct Primitive {
        /// Field 1: the type variation; 0 is the default.
        #[prost(uint32, tag = "1")]
        pub type_variation_reference: u32,
    }

    /// The modelled branches of [`DataType::kind`](super::DataType::kind) (connect §1.33).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Kind {
        /// Field 1: `NULL`.
        #[prost(message, tag = "1")]
        Null(Primitive),
        /// Field 3: `boolean`.
        #[prost(message, tag = "3")]
        Boolean(Primitive),
        /// Field 6: `int`.
        #[prost(message, tag = "6")]
        Integer(Primitive),
        /// Field 7: `bigint`, the type of `range`'s `id` column.
        #[prost(message, tag = "7")]
        Long(Primitive),
        /// Field 9: `double`.
        #[prost(message, tag = "9")]
        Double(Primitive),
        /// Field 11: `string`.
        #[prost(message, tag = "11")]
        String(Primitive),
        /// Field 21: a struct, the type of a row.
        #[prost(message, tag = "21")]
        Struct(Struct),
    }

    /// `spark.connect.DataType.Struct` (connect §1.34).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Struct {
        /// Field 1: the fields, in column order.
        #[prost(message, repeated, tag = "1")]
        pub fields: Vec<StructField>,
        /// Field 2: the type variation.
        #[prost(uint32, tag = "2")]
        pub type_variation_reference: u32,
    }

    /// `spark.connect.DataType.StructField` (connect §1.35).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct StructField {
        /// Field 1: the column name.
        #[prost(string, tag = "1")]
        pub name: ::prost::alloc::string::String,
        /// Field 2: the column type.
        #[prost(message, optional, tag = "2")]
        pub data_type: Option<super::DataType>,
        /// Field 3: whether the column may hold `NULL`.
        #[prost(bool, tag = "3")]
        pub nullable: bool,
        /// Field 4: column metadata as JSON.
        #[prost(string, optional, tag = "4")]
        pub metadata: Option<::prost::alloc::string::String>,
    }
}

impl DataType {
    /// `bigint` (connect §1.36).
    pub fn long() -> Self {
        Self {
            kind: Some(data_type::Kind::Long(data_type::Primitive::default())),
        }
    }

    /// A struct of `(name, type, nullable)` columns: the schema of a result (connect §1.34).
    pub fn row<I, S>(columns: I) -> Self
    where
        I: IntoIterator<Item = (S, Self, bool)>,
        S: Into<String>,
    {
        let fields = columns
            .into_iter()
            .map(|(name, data_type, nullable)| data_type::StructField {
                name: name.into(),
                data_type: Some(data_type),
                nullable,
                metadata: None,
            })
            .collect();
        Self {
            kind: Some(data_type::Kind::Struct(data_type::Struct {
                fields,
                type_variation_reference: 0,
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn range_row_counts_follow_the_direction_of_the_step() {
        let r = |start, end, step| Range {
            start,
            end,
            step,
            num_partitions: None,
        };
        assert_eq!(r(None, 10, 1).row_count(), Some(10));
        assert_eq!(r(Some(0), 10, 3).row_count(), Some(4)); // 0 3 6 9
        assert_eq!(r(Some(10), 0, -3).row_count(), Some(4)); // 10 7 4 1
        assert_eq!(r(Some(0), 10, -1).row_count(), Some(0));
        assert_eq!(r(Some(5), 5, 1).row_count(), Some(0));
        assert_eq!(r(None, 10, 0).row_count(), None);
        assert_eq!(
            r(Some(i64::MIN), i64::MAX, 1).row_count(),
            Some(u64::MAX) // 2^64 - 1 values
        );
    }

    fn count_of(literal: expression::literal::LiteralType) -> Expression {
        Expression {
            expr_type: Some(expression::ExprType::UnresolvedFunction(
                expression::UnresolvedFunction {
                    function_name: "count".into(),
                    arguments: vec![Expression {
                        expr_type: Some(expression::ExprType::Literal(expression::Literal {
                            literal_type: Some(literal),
                        })),
                    }],
                    ..Default::default()
                },
            )),
        }
    }

    #[test]
    fn count_of_one_is_recognised_directly_and_under_an_alias() {
        use expression::literal::LiteralType;
        assert!(count_of(LiteralType::Integer(1)).is_count_of_one());
        assert!(count_of(LiteralType::Long(1)).is_count_of_one());
        assert!(!count_of(LiteralType::Integer(2)).is_count_of_one());
        let aliased = Expression {
            expr_type: Some(expression::ExprType::Alias(Box::new(expression::Alias {
                expr: Some(Box::new(count_of(LiteralType::Integer(1)))),
                name: vec!["count".into()],
                metadata: None,
            }))),
        };
        assert!(aliased.is_count_of_one());
    }

    #[test]
    fn a_count_plan_round_trips_through_its_bytes() {
        let plan = Relation {
            common: Some(RelationCommon {
                source_info: String::new(),
                plan_id: Some(2),
            }),
            rel_type: Some(relation::RelType::Aggregate(Box::new(Aggregate {
                input: Some(Box::new(Relation {
                    common: None,
                    rel_type: Some(relation::RelType::Range(Range {
                        start: Some(0),
                        end: 100,
                        step: 1,
                        num_partitions: None,
                    })),
                })),
                group_type: aggregate::GroupType::Groupby as i32,
                grouping_expressions: vec![],
                aggregate_expressions: vec![count_of(expression::literal::LiteralType::Integer(1))],
            }))),
        };
        let bytes = plan.encode_to_vec();
        assert_eq!(Relation::decode(&bytes[..]).unwrap(), plan);
    }
}
