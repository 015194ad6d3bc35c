"""CPU parameter tables: their JSON form (SCHEMA.md) and extraction from llvm-mca."""

from diffsim.params.extract import build_table as build_table
