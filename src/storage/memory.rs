//! The memory provider: stores in memory, one provider-wide byte counter.
