module lab.local/gobuild/lab-programs

go 1.26.8
