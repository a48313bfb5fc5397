#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int huge=atoi(argv[1]); size_t gb=atoi(argv[2]); size_t len=gb<<30;
  char*p=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(p,len,huge?MADV_HUGEPAGE:MADV_NOHUGEPAGE);
  for(size_t g=0;g<gb;g++){double t=now(); madvise(p+(g<<30),1UL<<30,MADV_POPULATE_WRITE); printf("%.0f ",1024/(now()-t)); fflush(stdout);}
  printf("\n");
}
