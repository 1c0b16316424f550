//! The FGD evaluation method (DESIGN.md §5).
