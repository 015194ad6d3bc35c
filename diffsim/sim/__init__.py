"""The pure-functional pipeline simulator (llvm-mca's model class)."""
